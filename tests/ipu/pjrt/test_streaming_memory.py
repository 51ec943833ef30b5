"""Streaming memory as the JAX memory kind "pinned_host": each IPU lists its
SRAM and its streaming memory; arrays placed there do not count against
SRAM; jit moves values between them (jax.device_put inside jit,
out_shardings with a memory kind) at the streaming memory's bandwidth, with
values matching XLA:CPU running the same program; computing on a value in
streaming memory is refused at compile time."""
import jax
import numpy as np
import pytest
from jax.sharding import SingleDeviceSharding
from streaming_cases import adam_moment, shardings

import jax_ipu


def test_each_ipu_lists_sram_and_streaming_memory(ipus):
    for ipu in ipus:
        assert [m.kind for m in ipu.addressable_memories()] == ["device", "pinned_host"]
        assert ipu.default_memory().kind == "device"
        assert all(m.addressable_by_devices() == [ipu] for m in ipu.addressable_memories())


def test_arrays_in_streaming_memory_take_no_sram(ipus):
    x = np.arange(1 << 14, dtype=np.float32)
    sram, streaming = ipus[0].memory_stats()["bytes_in_use"], jax_ipu.streaming_memory_in_use(ipus[0])
    on_host = jax.device_put(x, SingleDeviceSharding(ipus[0], memory_kind="pinned_host"))
    assert on_host.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(on_host), x)
    assert ipus[0].memory_stats()["bytes_in_use"] == sram
    assert jax_ipu.streaming_memory_in_use(ipus[0]) == streaming + x.nbytes
    back = jax.device_put(on_host, SingleDeviceSharding(ipus[0], memory_kind="device"))
    np.testing.assert_array_equal(np.asarray(back), x)
    assert ipus[0].memory_stats()["bytes_in_use"] == sram + x.nbytes
    on_host.delete()
    assert jax_ipu.streaming_memory_in_use(ipus[0]) == streaming


def test_moves_inside_jit_match_xla_cpu_and_are_charged(ipus):
    n = 1 << 16
    rng = np.random.default_rng(0)
    w, g, m = (rng.standard_normal(n * len(ipus)).astype(np.float32) for _ in range(3))
    results = {}
    for platform in ("cpu", "ipu"):
        devices = ipus if platform == "ipu" else jax.devices("cpu")[:1]
        sram, host = shardings(devices, "pinned_host")
        args = jax.device_put(w, sram), jax.device_put(g, sram), jax.device_put(m, host)
        f = jax.jit(adam_moment, out_shardings=(sram, host))
        new_w, new_m = f(*args)
        assert new_m.sharding.memory_kind == "pinned_host"
        results[platform] = np.asarray(new_w), np.asarray(new_m)
        if platform == "ipu":
            stats = f.lower(*args).compile().memory_analysis()
    for got, want in zip(results["ipu"], results["cpu"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # SRAM holds w and g's shards; m's shard is in streaming memory.
    assert stats.argument_size_in_bytes == 2 * n * 4
    assert stats.host_argument_size_in_bytes == stats.host_output_size_in_bytes == n * 4
    report = jax_ipu.last_profile(ipus[0])
    target = jax_ipu.target(ipus[0])
    per_cycle = target.streaming_bytes_per_second / target.clock_hz
    assert report["memory_stats"]["streaming"] >= 2 * n * 4
    # One load and one store of m's shard, each at the streaming bandwidth.
    assert report["time_breakdown"]["streaming_memory"] >= 2 * (n * 4 / per_cycle + target.streaming_latency_cycles)
    steps = [s for s in report["steps"] if s["name"].startswith("StreamingMemory")]
    assert len(steps) == 2


def test_out_shardings_with_a_memory_kind_store_the_result(ipus):
    sram, host = shardings(ipus, "pinned_host")
    x = jax.device_put(np.arange(8, dtype=np.float32), sram)
    y = jax.jit(lambda a: a + 1, out_shardings=host)(x)
    assert y.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(np.asarray(y), np.arange(8) + 1)
    assert jax_ipu.last_profile(ipus[0])["time_breakdown"]["streaming_memory"] > 0


def test_computing_on_streaming_memory_is_refused(ipus):
    _, host = shardings(ipus, "pinned_host")
    x = jax.device_put(np.ones(8, np.float32), host)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"multiply at .* computes on a value in streaming "
                                                          r"memory .*jax.device_put\(x, jax.memory.Space.Device\)"):
        jax.jit(lambda a: a * 2)(x)

    def loop(a):
        return jax.lax.fori_loop(0, 3, lambda i, c: c + a.sum(), 0.0)
    x = jax.device_put(np.ones(8, np.float32), SingleDeviceSharding(ipus[0], memory_kind="pinned_host"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="reduce at .* computes on a value in streaming memory"):
        jax.jit(loop)(x)


def test_moves_on_four_ipus_match_xla_cpu():
    import os

    from helpers import run_python
    here = os.path.dirname(os.path.abspath(__file__))
    code = """
import jax, numpy as np
from streaming_cases import adam_moment, shardings
ipus = jax.devices("ipu")
assert len(ipus) == 4
rng = np.random.default_rng(0)
w, g, m = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))
out = {}
for platform, devices in (("cpu", jax.devices("cpu")[:1]), ("ipu", ipus)):
    sram, host = shardings(devices, "pinned_host")
    r = jax.jit(adam_moment, out_shardings=(sram, host))(*jax.device_put((w, g), sram), jax.device_put(m, host))
    assert r[1].sharding.memory_kind == "pinned_host"
    out[platform] = [np.asarray(a) for a in r]
for a, b in zip(out["ipu"], out["cpu"]):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
import jax_ipu
assert all(jax_ipu.streaming_memory_in_use(d) == 1024 * 4 for d in ipus), [jax_ipu.streaming_memory_in_use(d) for d in ipus]
print("OK")
"""
    proc = run_python(code, path=[here], JAX_IPU_DEVICE_COUNT="4")
    assert "OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]
