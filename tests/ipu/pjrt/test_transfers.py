"""Host <-> IPU and IPU <-> IPU transfers, for every dtype the IPU holds."""
import jax
import numpy as np
import pytest

import jax_ipu
from helpers import IPU_DTYPES, random_array

SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (0,), (4, 0, 2), (1001,)]


@pytest.mark.parametrize("dtype", IPU_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip(ipu, dtype, shape):
    x = random_array(np.random.default_rng(0), shape, dtype)
    y = jax.device_put(x, ipu)
    assert y.devices() == {ipu} and y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(np.asarray(y), x)


def test_strided_and_negative_strided_host_arrays(ipu):
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    for view in (base[::2, 1::3], base[::-1], base.T, base[:, ::-2]):
        np.testing.assert_array_equal(np.asarray(jax.device_put(view, ipu)), view)


def test_ipu_to_ipu_and_ipu_to_cpu(ipus, cpu):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    on0 = jax.device_put(x, ipus[0])
    on1 = jax.device_put(on0, ipus[1])
    assert on1.devices() == {ipus[1]}
    np.testing.assert_array_equal(np.asarray(on1), x)
    back = jax.device_put(on1, cpu)
    assert back.devices() == {cpu}
    np.testing.assert_array_equal(np.asarray(back), x)


def test_host_link_bytes_are_counted(ipu):
    before = jax_ipu.transfer_stats(ipu)
    y = jax.device_put(np.ones((10, 10), np.float32), ipu)
    np.asarray(y)
    after = jax_ipu.transfer_stats(ipu)
    assert after["host_to_device_bytes"] - before["host_to_device_bytes"] == 400
    assert after["device_to_host_bytes"] - before["device_to_host_bytes"] == 400


@pytest.mark.parametrize("dtype", ["float64", "int64", "complex128"])
def test_types_the_ipu_lacks_are_refused_clearly(ipu, dtype):
    """(bfloat16 and complex64 are emulated: ops/test_bfloat16.py,
    ops/test_complex64.py.)"""
    x = np.ones(3, dtype=jax.numpy.dtype(dtype))
    with jax.enable_x64(True), pytest.raises(Exception) as info:
        jax.device_put(x, ipu).block_until_ready()
    assert "IPU" in str(info.value) and ("no" in str(info.value))


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "int4", "uint4"])
def test_narrow_types_are_refused_by_name(ipu, dtype):
    x = np.ones(3, dtype=jax.numpy.dtype(dtype))
    with pytest.raises(Exception, match=rf"{dtype} arrays cannot be placed on an IPU: it holds float32"):
        jax.device_put(x, ipu).block_until_ready()


def test_deleted_array_raises_jax_error(ipu):
    y = jax.device_put(np.ones(3, np.float32), ipu)
    y.delete()
    assert y.is_deleted()
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(y)


def test_copies_on_the_same_ipu_do_not_alias(ipu):
    x = jax.device_put(np.arange(5, dtype=np.float32), ipu)
    y = jax.device_put(x, ipu, may_alias=False)
    z = jax.numpy.array(x, copy=True)
    x.delete()
    for copy in (y, z):
        assert copy.devices() == {ipu}
        np.testing.assert_array_equal(np.asarray(copy), np.arange(5))
