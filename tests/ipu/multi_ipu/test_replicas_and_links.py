"""Several modelled IPUs: each replica runs on its own device with its own
memory plan and profile, collectives are charged over the IPU-Links, a
failing replica releases the others, and unsupported shardings fail at
compile time naming the pattern."""
import threading

import jax
import numpy as np
import pytest

import jax_ipu
from helpers import run_python
from jax_ipu.compiler.lowering.collectives import collective_cycles
from jax_ipu.errors import IpuRuntimeError
from jax_ipu.model import links


def _programs(ipus):
    from jax_ipu.pjrt import client
    return [client.CURRENT.device(d.id).last_program for d in ipus]


def test_replicas_run_on_their_devices_with_link_costs(ipus):
    x = np.ones((2, 1 << 16), np.float32)
    out = jax.pmap(lambda a: jax.lax.psum(a, "i") + 1.0, axis_name="i", devices=ipus)(x)
    np.testing.assert_array_equal(np.asarray(out), 3.0)
    assert [s.device for s in out.addressable_shards] == list(ipus)
    programs = _programs(ipus)
    assert programs[0] is programs[1] and programs[0] is not None
    target = jax_ipu.target(ipus[0])
    nbytes = 4 << 16
    link = nbytes / (target.ipu_link_bytes_per_second / target.clock_hz)   # 2(n-1)/n = 1 for n = 2
    cycles = collective_cycles(programs[0])
    assert cycles >= link + 2 * target.ipu_link_latency_cycles + target.ipu_sync_cycles
    assert cycles < programs[0].cycles
    assert programs[0].memory.fits
    for d in ipus:       # a profile per IPU
        assert jax_ipu.last_profile(d) is not None


def test_collective_time_grows_with_the_data(ipus):
    f = jax.pmap(lambda a: jax.lax.psum(a, "i"), axis_name="i", devices=ipus)
    cycles = []
    for n in (1 << 10, 1 << 18):
        jax.block_until_ready(f(np.ones((2, n), np.float32)))
        cycles.append(collective_cycles(_programs(ipus)[0]))
    assert cycles[1] > cycles[0] + (4 * ((1 << 18) - (1 << 10))) / 32


def test_launch_abort_releases_waiting_replicas():
    launch = links.Launch(2, timeout=30)
    errors = []

    def wait():
        try:
            launch.exchange(0, np.zeros(1), lambda values: values)
        except IpuRuntimeError as exc:
            errors.append(str(exc))
    t = threading.Thread(target=wait)
    t.start()
    launch.abort("replica 1 failed: boom")
    t.join(10)
    assert not t.is_alive() and errors and "replica 1 failed: boom" in errors[0]


def test_launch_timeout_names_the_cause():
    launch = links.Launch(2, timeout=0.2)
    with pytest.raises(IpuRuntimeError, match="did not reach the collective"):
        launch.exchange(0, np.zeros(1), lambda values: values)


def test_too_large_for_one_ipu_fails_per_ipu():
    proc = run_python("""
import jax, numpy as np
try:
    jax.pmap(lambda a: jax.lax.psum(a * 2, "i"), axis_name="i")(np.ones((2, 400_000), np.float32))
except Exception as exc:
    print("ERROR", type(exc).__name__, exc)
""", JAX_IPU_DEVICE_COUNT="2", JAX_IPU_MODEL_NUM_TILES="1", JAX_PLATFORMS="ipu")
    assert "ERROR" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "memory" in proc.stdout.lower() and "tile" in proc.stdout.lower(), proc.stdout


def test_two_dimensional_mesh_collective_over_one_axis():
    proc = run_python("""
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices("ipu")).reshape(2, 2), ("a", "b"))
s = NamedSharding(mesh, P("a", "b"))
x = np.arange(16, dtype=np.float32).reshape(4, 4)
for axis in ("a", "b"):
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, axis), mesh=mesh, in_specs=P("a", "b"),
                              out_specs=P("a", "b")), in_shardings=s, out_shardings=s)
    blocks = x.reshape(2, 2, 2, 2)
    expected = np.broadcast_to(blocks.sum(0 if axis == "a" else 2, keepdims=True), blocks.shape).reshape(4, 4)
    np.testing.assert_array_equal(np.asarray(f(x)), expected)
print("OK")
""", JAX_IPU_DEVICE_COUNT="4", JAX_PLATFORMS="ipu")
    assert "OK" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_a_failing_host_callback_in_a_sharded_jit_fails_every_ipu_clearly(ipus):
    # The callback runs once (on the first IPU); its error reaches the
    # caller, the other IPU does not wait for results that never come,
    # and the devices run the next program.
    from jax.experimental import io_callback
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = Mesh(np.array(ipus), ("i",))
    x = jax.device_put(np.arange(8, dtype=np.float32), NamedSharding(mesh, P("i")))
    calls = []

    def fail(v):
        calls.append(float(v))
        raise ValueError("no such batch")
    f = jax.jit(lambda a: a * io_callback(fail, jax.ShapeDtypeStruct((), np.float32), a.sum()))
    with pytest.raises(jax.errors.JaxRuntimeError, match="no such batch"):
        np.asarray(f(x))
    assert calls == [28.0]
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a + 1)(x)), np.arange(8) + 1)
