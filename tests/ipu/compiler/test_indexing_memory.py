"""The memory plan of data-dependent indexing (compiler.planners.slice.plan_slice, popops
multiSlice / multiUpdate): big tables stay where they live, exchange
buffers are bounded per tile, so realistic embedding lookups and scatters
fit the default ipu2 target; a program that truly does not fit still fails
with the tile, the bytes and the largest tensors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import lower
from jax_ipu.compiler import compile_module
from jax_ipu.compiler.planners.slice import ROUND_BUFFER_SHARE
from jax_ipu.errors import IpuOutOfMemoryError
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.graph.validate import validate
from jax_ipu.targets import get_target

IPU2 = get_target("ipu2")
VOCAB, WIDTH, BATCH = 50_000, 512, 256          # a 100 MB embedding table


def spec(shape, dtype=np.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def indexing_steps(program):
    return [s for s in leaves(program.body) if isinstance(s, Execute) and s.compute_set.exchange is not None]


def compile_for(f, *args, target=IPU2):
    program = compile_module(lower(f, *args), target)
    validate(program, target.num_tiles)
    return program


@pytest.mark.parametrize("what, f, args", [
    ("gather", lambda t, i: t[i], (spec((VOCAB, WIDTH)), spec((BATCH,), np.int32))),
    ("scatter-add", lambda t, i, u: t.at[i].add(u),
     (spec((VOCAB, WIDTH)), spec((BATCH,), np.int32), spec((BATCH, WIDTH)))),
    ("dynamic_slice", lambda t, i: lax.dynamic_slice(t, (i, 0), (1000, WIDTH)),
     (spec((VOCAB, WIDTH)), spec((), np.int32))),
    ("dynamic_update_slice", lambda t, i, u: lax.dynamic_update_slice(t, u, (i, 0)),
     (spec((VOCAB, WIDTH)), spec((), np.int32), spec((BATCH, WIDTH)))),
], ids=lambda x: x if isinstance(x, str) else "")
def test_big_tables_fit_with_bounded_buffers(what, f, args):
    program = compile_for(f, *args)
    m = program.memory
    assert m.fits, m.describe()
    table_share = VOCAB * WIDTH * 4 // IPU2.num_tiles
    # The table and the result each take about a tile's share, and the
    # exchange buffers one round's budget: far below the whole table.
    assert m.max_bytes < 4 * table_share + ROUND_BUFFER_SHARE * IPU2.bytes_per_tile
    (step,) = indexing_steps(program)
    plan = step.compute_set.exchange
    assert plan.buffers.max() <= ROUND_BUFFER_SHARE * IPU2.bytes_per_tile
    assert plan.rounds > 1 and step.cycles > plan.rounds * IPU2.sync_cycles
    assert step.exchange_bytes == int(plan.received.sum())


def test_gather_exchange_brings_the_output_and_broadcasts_the_indices():
    program = compile_for(lambda t, i: t[i], spec((VOCAB, WIDTH)), spec((BATCH,), np.int32))
    (step,) = indexing_steps(program)
    plan = step.compute_set.exchange
    table_tiles = min(IPU2.num_tiles, -(-VOCAB * WIDTH // -(-VOCAB * WIDTH // IPU2.num_tiles)))
    # Every table tile receives every index once; the output's tiles its rows.
    assert int(plan.received.sum()) == BATCH * WIDTH * 4 + table_tiles * BATCH * 4
    # A tile sends at least one row when it holds rows, never the whole table.
    assert WIDTH * 4 <= plan.sent.max() < 2 * WIDTH * 4 + BATCH * 4


def test_buffers_of_a_window_bigger_than_the_budget_go_in_parts():
    small = get_target("ipu2", num_tiles=16)
    x, i = spec((64, 4096)), spec((), np.int32)      # 1 MiB table, 64 KiB per tile
    program = compile_for(lambda x, i: lax.dynamic_slice(x, (i, 0), (48, 4096)), x, i, target=small)
    (step,) = indexing_steps(program)
    plan = step.compute_set.exchange
    budget = ROUND_BUFFER_SHARE * small.bytes_per_tile
    assert plan.rounds == -(-(64 * 1024 + 4) // int(budget)) and plan.buffers.max() <= budget
    assert program.memory.fits


def test_embedding_lookup_and_update_run_on_the_default_target(ipu):
    """Through JAX on the default ipu2 (1472 tiles): a 50k x 512 table."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    ids = rng.integers(0, VOCAB, BATCH).astype(np.int32)
    ids[:4] = [7, 7, VOCAB - 1, 0]                   # duplicates and both ends
    grads = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    t, i, g = jax.device_put((table, ids, grads), ipu)
    np.testing.assert_array_equal(jax.jit(lambda t, i: t[i])(t, i), table[ids])
    want = table.copy()
    np.add.at(want, ids, grads)
    got = jax.jit(lambda t, i, g: t.at[i].add(g))(t, i, g)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    step = jax.jit(lambda t, k: lax.dynamic_slice(t, (k, 0), (1000, WIDTH)))
    np.testing.assert_array_equal(step(t, jnp.int32(49_500)), table[49_000:])   # start clamped


def test_scan_over_a_big_array_fits(ipu):
    """scan reads xs[i] (dynamic_slice) and writes ys[i]
    (dynamic_update_slice) every iteration: 32 MB in and out."""
    xs = np.random.default_rng(1).standard_normal((16, 1 << 19)).astype(np.float32)

    def f(xs):
        return lax.scan(lambda c, x: (c + x[:8].sum(), x * 2), jnp.float32(0), xs)
    carry, ys = jax.jit(f)(jax.device_put(xs, ipu))
    np.testing.assert_allclose(float(carry), xs[:, :8].sum(), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(ys), xs * 2)


def test_a_gather_that_truly_does_not_fit_still_fails():
    # 470k rows of 2 KiB: the result alone is over the chip's 897 MiB.
    with pytest.raises(IpuOutOfMemoryError) as info:
        compile_module(lower(lambda t, i: t[i], spec((VOCAB, WIDTH)), spec((470_000,), np.int32)), IPU2)
    # 240M elements, more than the whole IPU holds: refused as the tensor is
    # made, before the host builds gigabytes of per-element mappings.
    message = str(info.value)
    assert message.startswith("out of memory: gather@") and "float32[470000, 512]" in message
    assert f"takes {470_000 * 512 * 4:,} bytes, more than all of" in message
    assert f"({IPU2.num_tiles * IPU2.bytes_per_tile:,} bytes)" in message


def test_a_scatter_that_truly_does_not_fit_still_fails():
    tiny = get_target("ipu2", num_tiles=4)   # the 4 MiB table and its update do not fit 4 tiles
    with pytest.raises(IpuOutOfMemoryError) as info:
        compile_module(lower(lambda t, i, u: t.at[i].add(u), spec((2048, 512)), spec((64,), np.int32),
                             spec((64, 512))), tiny)
    assert "out of memory on tile" in str(info.value)
    assert "float32[2048, 512]" in str(info.value).split("Largest tensors there:")[1]
