"""compute_on('device_host') on the IPU: the IPU system has no processor
beside its streaming memory, so the function runs on the tiles; the values
in streaming memory it reads are loaded first, its results go where its
out_memory_spaces say, and its compute sets are named for it in profiles.
Values against numpy."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compute_on import compute_on2
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import jax_ipu
from jax_ipu.compiler.passes.streaming import ON_TILES

HOST = jax.memory.Space.Host
DEVICE = jax.memory.Space.Device


@compute_on2(compute_type="device_host", out_memory_spaces=(HOST, DEVICE))
def moment_update(m, g):
    """An optimizer moment kept in streaming memory, updated "on the host"."""
    g = jax.device_put(g, HOST)
    m = 0.9 * m + 0.1 * g
    return m, jnp.sqrt(jnp.abs(m))


def test_a_host_function_loads_its_inputs_in_streaming_memory_and_runs_on_the_tiles(ipu):
    host, sram = SingleDeviceSharding(ipu, memory_kind="pinned_host"), SingleDeviceSharding(ipu)
    rng = np.random.default_rng(0)
    m, g = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
    f = jax.jit(moment_update, out_shardings=(host, sram), donate_argnums=0)
    new_m, root = f(jax.device_put(m, host), jax.device_put(g, sram))
    want = np.float32(0.9) * m + np.float32(0.1) * g
    np.testing.assert_allclose(np.asarray(new_m), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(root), np.sqrt(np.abs(want)), rtol=1e-6, atol=1e-6)
    assert (new_m.sharding.memory_kind, root.sharding.memory_kind) == ("pinned_host", "device")
    steps = jax_ipu.last_profile(ipu)["steps"]
    moves = [s["name"].split()[1] for s in steps if s["name"].startswith("StreamingMemory")]
    assert sorted(moves) == ["load", "store"]          # m loaded, the new m stored
    computed = [s for s in steps if s["kind"] == "Execute"]
    assert computed and all(s["name"].endswith(ON_TILES) for s in computed)


def test_a_host_function_in_a_scan_body(ipu):
    xs = np.arange(4096, dtype=np.int32).reshape(16, 16, 16)

    @jax.jit
    def f(xs):
        def body(carry, x):
            return carry, compute_on2(lambda a, b: a + b, compute_type="device_host", out_memory_spaces=DEVICE)(x, carry)
        return jax.lax.scan(body, 1, xs)[1]
    np.testing.assert_array_equal(np.asarray(f(jax.device_put(xs, ipu))), xs + 1)


def test_a_host_function_on_split_values_in_streaming_memory(ipus):
    mesh = Mesh(np.array(ipus[:2]), ("x",))
    host = NamedSharding(mesh, P("x"), memory_kind="pinned_host")
    x = np.arange(16, dtype=np.float32).reshape(8, 2)

    @jax.jit(out_shardings=host)
    def f(a):
        return compute_on2(lambda a: a * a + 1, compute_type="device_host", out_memory_spaces=DEVICE)(a)
    out = f(jax.device_put(x, host))
    np.testing.assert_array_equal(np.asarray(out), x * x + 1)
    assert out.sharding == host


def test_the_gradient_of_a_host_function(ipu):
    g = compute_on2(jnp.sin, compute_type="device_host", out_memory_spaces=DEVICE)
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    got = jax.jit(jax.grad(lambda x: jnp.sum(g(x))))(jax.device_put(x, ipu))
    np.testing.assert_allclose(np.asarray(got), np.cos(x), rtol=1e-5, atol=1e-6)
