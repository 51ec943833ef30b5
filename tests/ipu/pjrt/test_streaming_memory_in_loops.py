"""Streaming memory inside loops and branches: a scan reads a value in
streaming memory a window per step and stacks values it moves there a row
per step (one copy of the window each, at the streaming memory's bandwidth,
never the whole value); activation offloading with a remat policy in a
scan; moves inside lax.cond. Values against numpy or XLA:CPU."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import jax_ipu

HOST = jax.memory.Space.Host
DEVICE = jax.memory.Space.Device


def _window_cycles(ipu, nbytes: int) -> int:
    """What the compiler charges one move of `nbytes` (bandwidth and latency)."""
    t = jax_ipu.target(ipu)
    return int(np.ceil(nbytes / (t.streaming_bytes_per_second / t.clock_hz))) + t.streaming_latency_cycles


def _streaming_steps(ipu) -> list[str]:
    return [s["name"] for s in jax_ipu.last_profile(ipu)["steps"] if s["name"].startswith("StreamingMemory")]


@pytest.mark.parametrize("reverse", [False, True])
def test_a_scan_reads_an_offloaded_value_a_row_per_step(ipu, reverse):
    xs = np.random.default_rng(0).standard_normal((12, 16, 8)).astype(np.float32)

    @jax.jit
    def f(xs):
        def body(carry, x):
            x = jax.device_put(x, DEVICE)
            return carry * 0.5 + x, x * 2
        return jax.lax.scan(body, jnp.zeros((16, 8), jnp.float32), xs, reverse=reverse)
    carry, ys = f(jax.device_put(xs, SingleDeviceSharding(ipu, memory_kind="pinned_host")))
    want_carry = np.zeros((16, 8), np.float32)
    for x in (xs[::-1] if reverse else xs):
        want_carry = want_carry * np.float32(0.5) + x
    np.testing.assert_allclose(np.asarray(carry), want_carry, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(ys), xs * 2)
    assert ys.sharding.memory_kind == "device"
    # One copy of a row per step: xs is never moved whole.
    report = jax_ipu.last_profile(ipu)
    assert report["time_breakdown"]["streaming_memory"] == 12 * _window_cycles(ipu, 16 * 8 * 4)
    assert len(_streaming_steps(ipu)) == 12


@pytest.mark.parametrize("reverse", [False, True])
def test_a_scan_stacks_offloaded_outputs_a_row_per_step(ipu, reverse):
    xs = np.random.default_rng(1).standard_normal((10, 32)).astype(np.float32)

    @jax.jit
    def f(xs):
        def body(carry, x):
            carry = jnp.sin(carry) + x
            return carry, jax.device_put(carry * 3, HOST)
        return jax.lax.scan(body, jnp.ones(32, jnp.float32), xs, reverse=reverse)[1]
    ys = f(jax.device_put(xs, ipu))
    assert ys.sharding.memory_kind == "pinned_host"
    want = jax.jit(lambda xs: jax.lax.scan(lambda c, x: (jnp.sin(c) + x,) * 2, jnp.ones(32, jnp.float32), xs,
                                           reverse=reverse)[1] * 3)(jax.device_put(xs, jax.devices("cpu")[0]))
    np.testing.assert_allclose(np.asarray(ys), np.asarray(want), rtol=1e-5, atol=1e-6)
    # Each row stored once, into its place; the stack is never filled
    # first (the loop writes every row before the program reads any).
    assert jax_ipu.last_profile(ipu)["time_breakdown"]["streaming_memory"] == 10 * _window_cycles(ipu, 32 * 4)
    stats = f.lower(jax.device_put(xs, ipu)).compile().memory_analysis()
    assert stats.host_output_size_in_bytes == xs.nbytes


def test_a_stack_read_before_it_is_written_starts_as_given(ipu):
    """Rows read before the loop writes them hold the initial values: the
    stack is stored whole before the loop, then a row at a time."""
    x = np.arange(8, dtype=np.float32)

    @jax.jit
    def f(x):
        stack = jax.device_put(jnp.ones((8, 4), jnp.float32), HOST)

        def body(i, stack):
            previous = jax.device_put(jax.lax.dynamic_index_in_dim(stack, (i + 7) % 8, keepdims=False), DEVICE)
            row = jax.device_put(previous * 2 + x[i], HOST)
            return jax.lax.dynamic_update_index_in_dim(stack, row, i, 0)
        return jax.lax.fori_loop(0, 8, body, stack)
    got = f(jax.device_put(x, ipu))
    want = np.ones((8, 4), np.float32)
    for i in range(8):
        want[i] = want[(i + 7) % 8] * 2 + x[i]
    np.testing.assert_array_equal(np.asarray(got), want)
    assert got.sharding.memory_kind == "pinned_host"
    whole = _window_cycles(ipu, want.nbytes)
    row = _window_cycles(ipu, 4 * 4)
    assert jax_ipu.last_profile(ipu)["time_breakdown"]["streaming_memory"] == whole + 8 * 2 * row


def test_a_loop_of_unknown_trip_count_stores_its_rows(ipu):
    xs = np.random.default_rng(2).standard_normal((6, 5)).astype(np.float32)

    @jax.jit
    def f(xs, n):
        def cond(state):
            return state[0] < n

        def body(state):
            i, stack = state
            row = jax.device_put(jnp.cos(jax.lax.dynamic_index_in_dim(xs, i, keepdims=False)), HOST)
            return i + 1, jax.lax.dynamic_update_index_in_dim(stack, row, i, 0)
        return jax.lax.while_loop(cond, body, (0, jax.device_put(jnp.zeros((6, 5), jnp.float32), HOST)))[1]
    got = f(jax.device_put(xs, ipu), jax.device_put(np.int32(4), ipu))
    want = np.zeros((6, 5), np.float32)
    want[:4] = np.cos(xs[:4])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    assert got.sharding.memory_kind == "pinned_host"


def _unrolled_stack(xs):
    """Two steps per iteration: the two rows are concatenated, then stored."""
    return jax.lax.scan(lambda c, x: (c + x, jax.device_put(c * x, HOST)), jnp.zeros(5), xs, unroll=2)[1]


def _state_in_streaming_memory(xs):
    """A carried value kept in streaming memory, loaded and stored each step."""
    def body(m, x):
        return jax.device_put(jax.device_put(m, DEVICE) * 0.9 + x, HOST), None
    return jax.lax.scan(body, jax.device_put(jnp.ones(5), HOST), xs)[0]


def _moved_in_a_branch(xs):
    def body(c, x):
        y = jax.lax.cond(c.sum() > 0, lambda x: jax.device_put(x * 2, HOST), lambda x: jax.device_put(x - 1, HOST), x)
        return c + 1, y
    return jax.lax.scan(body, jnp.zeros(5) - 2, xs)[1]


@pytest.mark.parametrize("f", [_unrolled_stack, _state_in_streaming_memory, _moved_in_a_branch])
def test_loops_moving_values_match_numpy(ipu, f):
    xs = np.random.default_rng(5).standard_normal((8, 5)).astype(np.float32)
    got = jax.jit(f)(jax.device_put(xs, ipu))
    assert got.sharding.memory_kind == "pinned_host"
    on_cpu = jax.jit(f)(jax.device_put(xs, jax.devices("cpu")[0]))      # XLA:CPU, with its host memory
    np.testing.assert_allclose(np.asarray(got), np.asarray(on_cpu), rtol=1e-6, atol=1e-6)


def _remat_scan(policy):
    @functools.partial(jax.remat, policy=policy)
    def step(h, w):
        z = checkpoint_name(jnp.sin(h @ w), "z")
        return checkpoint_name(jnp.tanh(z) * 2, "y"), None

    def loss(ws, x):
        h, _ = jax.lax.scan(step, x, ws)
        return jnp.sum(h ** 2)
    return jax.jit(jax.grad(loss))


def test_activation_offloading_in_a_scan_matches_xla_cpu_and_frees_sram(ipu):
    """jax.checkpoint_policies.save_and_offload_only_these_names: the
    forward scan stacks the residuals in streaming memory, the backward
    scan loads them a step at a time."""
    offload = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["z", "y"], offload_src="device",
        offload_dst="pinned_host")
    save = jax.checkpoint_policies.save_only_these_names("z", "y")
    rng = np.random.default_rng(3)
    ws = (rng.standard_normal((12, 32, 32)) / 6).astype(np.float32)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    cpu = jax.devices("cpu")[0]
    want = np.asarray(_remat_scan(offload)(jax.device_put(ws, cpu), jax.device_put(x, cpu)))
    stats = {}
    for name, policy in (("offload", offload), ("save", save)):
        f = _remat_scan(policy)
        args = jax.device_put(ws, ipu), jax.device_put(x, ipu)
        np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
        stats[name] = f.lower(*args).compile().memory_analysis()
        if name == "offload":
            assert jax_ipu.last_profile(ipu)["time_breakdown"]["streaming_memory"] > 0
    # A stack of residuals (12 steps of 64 x 32 float32) is in streaming
    # memory, and out of the tiles' temporaries.
    stack = 12 * 64 * 32 * 4
    assert stats["offload"].host_temp_size_in_bytes >= stack
    assert stats["save"].host_temp_size_in_bytes == 0
    assert stats["offload"].temp_size_in_bytes < stats["save"].temp_size_in_bytes


def test_moves_inside_cond_branches(ipu):
    x = np.arange(6, dtype=np.float32)

    @jax.jit
    def f(p, x, h):
        def stored(x, h):
            return jax.device_put(x * 2, HOST), jax.device_put(h, DEVICE) + 1

        def also_stored(x, h):
            return jax.device_put(x - 1, HOST), jax.device_put(h, DEVICE) * 3
        return jax.lax.cond(p, stored, also_stored, x, h)
    h = jax.device_put(x + 10, SingleDeviceSharding(ipu, memory_kind="pinned_host"))
    for p, want in ((True, (x * 2, x + 11)), (False, (x - 1, (x + 10) * 3))):
        a, b = f(jax.device_put(np.bool_(p), ipu), jax.device_put(x, ipu), h)
        assert a.sharding.memory_kind == "pinned_host" and b.sharding.memory_kind == "device"
        np.testing.assert_array_equal(np.asarray(a), want[0])
        np.testing.assert_array_equal(np.asarray(b), want[1])


def test_a_split_offloaded_value_read_in_a_scan_keeps_its_split(ipus):
    mesh = Mesh(np.array(ipus[:2]).reshape(1, 2), ("x", "z"))
    xs = np.arange(4096.0, dtype=np.float32).reshape(16, 16, 16)
    arr = jax.device_put(xs, NamedSharding(mesh, P("x", None, "z"), memory_kind="pinned_host"))

    @jax.jit
    def f(xs):
        def body(carry, x):
            return carry, jax.device_put(x, DEVICE) + carry
        return jax.lax.scan(body, 1.0, xs)[1]
    out = f(arr)
    np.testing.assert_array_equal(np.asarray(out), xs + 1)
    assert out.sharding == NamedSharding(mesh, P(None, None, "z"), memory_kind="device")


def test_computing_on_an_offloaded_row_inside_a_loop_is_refused(ipu):
    xs = jax.device_put(np.ones((4, 8), np.float32), SingleDeviceSharding(ipu, memory_kind="pinned_host"))

    def f(xs):
        return jax.lax.scan(lambda c, x: (c, jnp.sin(x)), 0.0, xs)[1]
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"sine at .* computes on a value in streaming memory"):
        jax.jit(f)(xs)


def test_a_loaded_executable_moves_windows_as_compiled(ipu):
    """Its StreamingCopy steps survive jax.experimental.serialize_executable."""
    from jax.experimental import serialize_executable as se
    xs = np.random.default_rng(4).standard_normal((5, 7)).astype(np.float32)

    def f(xs):
        return jax.lax.scan(lambda c, x: (c, jax.device_put(jax.device_put(x, DEVICE) * 2, HOST)), 0.0, xs)[1]
    arg = jax.device_put(xs, SingleDeviceSharding(ipu, memory_kind="pinned_host"))
    compiled = jax.jit(f).lower(arg).compile()
    payload, in_tree, out_tree = se.serialize(compiled)
    loaded = se.deserialize_and_load(payload, in_tree, out_tree, backend="ipu", execution_devices=[ipu])
    out = loaded(arg)
    np.testing.assert_array_equal(np.asarray(out), xs * 2)
    assert out.sharding.memory_kind == "pinned_host"
    assert len(_streaming_steps(ipu)) == 2 * 5
