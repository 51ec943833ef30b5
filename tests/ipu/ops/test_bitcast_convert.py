"""stablehlo.bitcast_convert between element types of different widths
(XLA's little-endian reinterpretation: the wide element is the narrow ones
along a new minor axis) on the ipu device against JAX's CPU backend,
compared bit for bit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu

WIDE = [np.uint32, np.int32, np.float32, np.uint16, np.int16, np.float16]
NARROW = [np.uint16, np.int16, np.float16, np.uint8, np.int8]
PAIRS = [(w, n) for w in WIDE for n in NARROW if np.dtype(w).itemsize > np.dtype(n).itemsize]


def bits(shape, dtype, seed=0):
    """Random bit patterns of `dtype` (NaNs included for floats)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).view(dtype).reshape(shape)


@pytest.mark.parametrize("shape", [(), (5,), (3, 4)], ids=str)
@pytest.mark.parametrize("wide, narrow", PAIRS, ids=lambda d: np.dtype(d).name)
def test_wide_to_narrow(wide, narrow, shape):
    assert_matches_cpu(lambda a: lax.bitcast_convert_type(a, narrow), bits(shape, wide), exact="bits")


@pytest.mark.parametrize("shape", [(), (5,), (3, 4)], ids=str)
@pytest.mark.parametrize("wide, narrow", PAIRS, ids=lambda d: np.dtype(d).name)
def test_narrow_to_wide(wide, narrow, shape):
    k = np.dtype(wide).itemsize // np.dtype(narrow).itemsize
    assert_matches_cpu(lambda a: lax.bitcast_convert_type(a, wide), bits(shape + (k,), narrow), exact="bits")


def test_round_trip_inside_a_loop_body():
    """Inlined into regions too, with arithmetic around it."""
    def f(x):
        def body(i, v):
            halves = lax.bitcast_convert_type(v, np.uint16)
            return lax.bitcast_convert_type(halves[..., ::-1] + np.uint16(1), np.uint32)
        return lax.fori_loop(0, 3, body, x)
    assert_matches_cpu(f, bits((6,), np.uint32), exact="bits")


@pytest.mark.parametrize("shape", [(), (1,), (4,)], ids=str)
@pytest.mark.parametrize("src, dst", [(np.float32, np.int32), (np.uint32, np.float32), (np.float16, np.int16),
                                      (np.int8, np.uint8)], ids=lambda d: np.dtype(d).name)
def test_same_width_keeps_the_shape(src, dst, shape):
    """A 0-d bitcast gave a (1,) array (random_test's key_data equality)."""
    assert_matches_cpu(lambda a: lax.bitcast_convert_type(a, dst), bits(shape, src), exact="bits")
    x = bits(shape, src)
    assert_matches_cpu(lambda a: lax.bitcast_convert_type(a, dst) == lax.bitcast_convert_type(a[None][0], dst), x,
                       exact="bits")


@pytest.mark.parametrize("n", [7, 300_000], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("dtype, as_bits", [(np.float32, np.int32), (np.float32, np.uint32),
                                            (np.float16, np.int16), (np.int32, np.float32)],
                         ids=lambda d: np.dtype(d).name)
def test_arithmetic_on_a_same_width_bitcast_leaves_its_operand_alone(dtype, as_bits, n):
    """The bitcast's result is read by an op that may write in place; the
    operand (here the caller's array, not donated) and its other readers
    keep their values."""
    ipu = jax.devices("ipu")[0]
    x = (np.random.default_rng(0).standard_normal(n) * 100).astype(dtype)
    f = lambda a: (lax.bitcast_convert_type(a, as_bits) + as_bits(1), a * dtype(2), jnp.abs(a))
    xd = jax.device_put(x, ipu)
    got = [np.asarray(v) for v in jax.jit(f)(xd)]
    want = [np.asarray(v) for v in jax.jit(f)(jax.device_put(x, jax.devices("cpu")[0]))]
    for g, w in zip(got, want, strict=True):
        assert g.tobytes() == w.tobytes()
    assert np.asarray(xd).tobytes() == x.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_bit_tricks_next_to_other_uses(dtype):
    """jnp.spacing and nextafter are bitcasts plus integer arithmetic."""
    x = np.array([1, 2, -3.5, 100, 0, -0.0, 1e-3, 6e4 if dtype == np.float16 else 3e38], dtype)
    assert_matches_cpu(lambda a: jnp.spacing(a), x, exact="bits")
    for f in (lambda a: (jnp.nextafter(a, a[::-1]), a - a[::-1]),
              lambda a: (lax.bitcast_convert_type(lax.bitcast_convert_type(a, np.uint32 if dtype == np.float32
                                                                           else np.uint16) | 1, dtype), a)):
        ipu, cpu = jax.devices("ipu")[0], jax.devices("cpu")[0]
        got = jax.jit(f)(jax.device_put(x, ipu))
        want = jax.jit(f)(jax.device_put(x, cpu))
        for g, w in zip(got, want, strict=True):
            assert np.asarray(g).tobytes() == np.asarray(w).tobytes()
