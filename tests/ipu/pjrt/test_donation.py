"""Donated buffers are reused in place on the IPU: the input is deleted,
and the donated state never crosses the host link."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ipu


def step(params, batch):
    return jax.tree.map(lambda p: p - 0.1 * jnp.mean(batch) * p, params)


def test_donated_input_is_deleted_and_reuse_raises(ipu):
    params = jax.device_put({"w": np.ones((64, 64), np.float32), "b": np.zeros(64, np.float32)}, ipu)
    update = jax.jit(step, donate_argnums=0)
    new = update(params, jax.device_put(np.ones(8, np.float32), ipu))
    assert params["w"].is_deleted() and params["b"].is_deleted()
    with pytest.raises(RuntimeError, match="deleted"):
        update(params, np.ones(8, np.float32))
    np.testing.assert_allclose(np.asarray(new["w"]), np.full((64, 64), 0.9), rtol=1e-6)


def test_donated_state_never_crosses_the_host_link(ipu):
    params = jax.device_put({"w": np.ones((256, 256), np.float32)}, ipu)
    update = jax.jit(step, donate_argnums=0)
    batch = np.ones(128, np.float32)
    params = update(params, batch)  # compile outside the measured loop
    before = jax_ipu.transfer_stats(ipu)
    for _ in range(5):
        params = update(params, batch)
    jax.block_until_ready(params)
    after = jax_ipu.transfer_stats(ipu)
    moved_in = after["host_to_device_bytes"] - before["host_to_device_bytes"]
    moved_out = after["device_to_host_bytes"] - before["device_to_host_bytes"]
    assert moved_in == 5 * batch.nbytes  # only the batches
    assert moved_out == 0
    np.testing.assert_allclose(np.asarray(params["w"]), np.full((256, 256), 0.9 ** 6), rtol=1e-5)


def test_donation_with_a_live_host_view_still_aliases(ipu):
    x = jax.device_put(np.arange(4, dtype=np.float32), ipu)
    view = np.asarray(x)  # a host copy: IPU memory is never aliased by the host
    y = jax.jit(lambda x: x + 1, donate_argnums=0)(x)
    assert x.is_deleted()
    np.testing.assert_array_equal(view, np.arange(4))
    np.testing.assert_array_equal(np.asarray(y), np.arange(4) + 1)


def test_donation_without_a_matching_output_is_dropped_not_wrong(ipu):
    x = jax.device_put(np.ones(3, np.float32), ipu)
    with pytest.warns(UserWarning, match="donated"):
        y = jax.jit(lambda x: x.sum(), donate_argnums=0)(x)
    assert float(y) == 3.0


@pytest.mark.parametrize("donate", [(0, 1), (0,), (1,)], ids=["both", "first", "second"])
def test_one_array_donated_and_passed_again_is_refused_and_kept(ipu, donate):
    """f(donate(a), a) and f(donate(a), donate(a)) are refused before
    anything is given away, as XLA:CPU refuses them: the array survives."""
    a = jax.device_put(np.arange(6, dtype=np.float32), ipu)
    f = jax.jit(lambda x, y: (x + y, x * 2), donate_argnums=donate)
    with pytest.raises(Exception, match="the same array is arguments 0 and 1 of one call"):
        f(a, a)
    assert not a.is_deleted()
    np.testing.assert_array_equal(np.asarray(a), np.arange(6, dtype=np.float32))
    b = jax.device_put(np.ones(6, np.float32), ipu)
    out = f(a, b) if donate != (1,) else f(b, a)
    np.testing.assert_array_equal(np.asarray(out[0]), np.arange(6, dtype=np.float32) + 1)
