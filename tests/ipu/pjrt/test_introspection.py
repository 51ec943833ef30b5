"""JAX's own introspection answered by the IPU compiler, through JAX:
compiled.cost_analysis(), compiled.memory_analysis(), device.memory_stats()."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ipu


def _compile(ipu, f, *shapes, **jit_options):
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=jax.sharding.SingleDeviceSharding(ipu)) for s in shapes]
    return jax.jit(f, **jit_options).lower(*args).compile()


def test_cost_analysis_counts_flops_transcendentals_and_cycles(ipu):
    compiled = _compile(ipu, lambda a, b: jnp.tanh(a @ b), (64, 32), (32, 16))
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    assert cost["flops"] == pytest.approx(2 * 64 * 32 * 16, rel=0.05)
    assert cost["transcendentals"] == 64 * 16
    assert cost["bytes accessed"] >= 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert cost["estimated_cycles"] > 0


def test_estimated_cycles_match_the_run(ipu):
    f = jax.jit(lambda a: jnp.sum(jnp.exp(a) * 3.0, axis=0))
    x = jax.device_put(np.ones((128, 64), np.float32), ipu)
    cost = f.lower(x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    f(x).block_until_ready()
    assert jax_ipu.last_profile(ipu)["cycles"]["device"] == cost["estimated_cycles"]


def test_memory_analysis(ipu):
    compiled = _compile(ipu, lambda a, b: (a @ b, a * 2), (64, 32), (32, 16))
    m = compiled.memory_analysis()
    assert m.argument_size_in_bytes == 4 * (64 * 32 + 32 * 16)
    assert m.output_size_in_bytes == 4 * (64 * 16 + 64 * 32)
    assert m.alias_size_in_bytes == 0
    assert m.generated_code_size_in_bytes > 0 and m.temp_size_in_bytes > 0
    assert m.host_argument_size_in_bytes == m.host_temp_size_in_bytes == 0
    peak = getattr(m, "peak_memory_in_bytes", None)
    if peak is not None:
        assert peak >= m.argument_size_in_bytes + m.generated_code_size_in_bytes


def test_memory_analysis_counts_donated_arguments(ipu):
    compiled = _compile(ipu, lambda a: a * 2 + 1, (1000,), donate_argnums=0)
    assert compiled.memory_analysis().alias_size_in_bytes == 4000


def test_device_memory_stats(ipus):
    ipu = ipus[1]
    target = jax_ipu.target(ipu)
    before = ipu.memory_stats()
    assert before["bytes_limit"] == target.num_tiles * target.bytes_per_tile
    x = jax.device_put(np.ones(25_000, np.float32), ipu)
    x.block_until_ready()
    during = ipu.memory_stats()
    assert during["bytes_in_use"] - before["bytes_in_use"] == 100_000
    assert during["peak_bytes_in_use"] >= during["bytes_in_use"]
    assert during["num_allocs"] >= before["num_allocs"] + 1
    x.delete()
    assert ipu.memory_stats()["bytes_in_use"] == before["bytes_in_use"]
