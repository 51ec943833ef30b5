"""Reductions over leading dims (a bias gradient's sum over the batch, a
batch mean, batch-norm statistics) combine whole rows on each tile, as
Poplar reduces outer dimensions, without a transposing Copy first: the
partials read their rows straight from the operand. Values against the
CPU backend; the layout and the read regions checked on the program."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import SMALL, assert_matches_cpu, compile_fn
from jax_ipu.compiler.lowering import reduce as reduce_rule
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Copy, Execute, leaves
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target

rng = np.random.default_rng(0)
IPU2 = get_target("ipu2")


def partial_steps(program):
    return [s for s in leaves(program.body) if isinstance(s, Execute)
            and isinstance(s.compute_set.kernel, codelets.ReducePartials)]


def check_outer_reduction(f, x, target=SMALL, rtol=1e-5, atol=1e-5, outer=True):
    """f's reductions run as outer (or inner) partials with no transposing
    copy, and its results match XLA:CPU's."""
    program = compile_fn(f, x, target=target)
    steps = partial_steps(program)
    assert steps and all(s.compute_set.kernel.outer == outer for s in steps)
    if outer:
        assert not [s for s in leaves(program.body) if isinstance(s, Copy)
                    and any(op[0] == "transpose" for op in getattr(s.src, "ops", ()))]
    assert_matches_cpu(f, x, got=Engine(target).run(program, [x]), rtol=rtol, atol=atol)
    return program


@pytest.mark.parametrize("op", [jnp.sum, jnp.max, jnp.min, jnp.mean])
def test_over_the_batch(op):
    x = rng.standard_normal((128, 512)).astype(np.float32)
    check_outer_reduction(lambda x: op(x, axis=0), x)


def test_product_and_integers():
    x = rng.uniform(0.9, 1.1, (40, 96)).astype(np.float32)
    check_outer_reduction(lambda x: jnp.prod(x, axis=0), x)
    i = rng.integers(-1000, 1000, (50, 70)).astype(np.int32)
    check_outer_reduction(lambda x: (jnp.sum(x, axis=0), jnp.max(x, axis=0)), i, rtol=0, atol=0)


def test_boolean_any_and_all():
    b = rng.random((30, 100)) > 0.1
    check_outer_reduction(lambda x: (jnp.all(x, axis=0), jnp.any(~x, axis=0)), b, rtol=0, atol=0)


def test_float16_sums_accumulate_in_float32():
    x = rng.standard_normal((256, 64)).astype(np.float16)
    check_outer_reduction(lambda x: jnp.sum(x, axis=0), x, rtol=2e-3, atol=2e-3)


def test_several_leading_dims_batch_norm_statistics():
    x = rng.standard_normal((8, 6, 6, 64)).astype(np.float32)

    def stats(x):
        mean = jnp.mean(x, axis=(0, 1, 2))
        return mean, jnp.mean((x - mean) ** 2, axis=(0, 1, 2))
    check_outer_reduction(stats, x)


def test_many_chunks_on_a_full_ipu_read_each_row_once():
    """On 1472 tiles a 4096-row sum is split into chunks of rows per tile:
    every input element is read by exactly one vertex."""
    x = rng.standard_normal((4096, 96)).astype(np.float32)
    program = check_outer_reduction(lambda x: jnp.sum(x, axis=0), x, target=IPU2, rtol=1e-4, atol=1e-4)
    [step] = partial_steps(program)
    chunks = step.compute_set.kernel.out.shape[1]
    assert chunks > 1
    counts = np.zeros(x.size, np.int64)
    for v in step.compute_set.vertices:
        for a, z in v.reads[0].intervals:
            counts[a:z] += 1
    assert (counts == 1).all()


def test_narrow_outputs_keep_the_transposing_copy():
    """Fewer than OUTER_MIN_KEPT outputs a row: transposed, then reduced
    along rows (numpy would add rows of a few elements at a time)."""
    x = rng.standard_normal((500, 8)).astype(np.float32)
    assert 8 < reduce_rule.OUTER_MIN_KEPT
    check_outer_reduction(lambda x: jnp.sum(x, axis=0), x, outer=False)


def test_argmax_over_the_batch_keeps_its_tree():
    x = rng.standard_normal((64, 80)).astype(np.float32)
    program = compile_fn(lambda x: jnp.argmax(x, axis=0), x)
    assert not partial_steps(program)
    np.testing.assert_array_equal(Engine(SMALL).run(program, [x])[0], np.argmax(x, axis=0))


def test_bias_gradient_through_the_plugin(ipu):
    x = rng.standard_normal((128, 300)).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    f = jax.jit(jax.grad(lambda b, x: jnp.sum(jnp.tanh(x + b) ** 2)))
    got = f(jax.device_put(b, ipu), jax.device_put(x, ipu))
    np.testing.assert_allclose(np.asarray(got), np.asarray(f(b, x)), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("size,kept,seed", [(5, 16, 0), (4, 17, 1), (2, 40, 2), (9, 16, 3)])
def test_outer_reads_by_tile_cover_exactly_the_rows_of_each_tiles_outputs(size, kept, seed):
    # Each tile's read intervals: sorted, disjoint, and exactly the input
    # elements [r, o] (r < size) behind its outputs [o].
    from jax_ipu.compiler.lowering.reduce import _outer_reads_by_tile
    from jax_ipu.graph.mapping import TileMapping
    rng = np.random.default_rng(seed)
    element_tiles = rng.integers(0, 5, kept)
    element_tiles[: kept // 3] = 1          # some long runs on one tile
    mapping = TileMapping.from_element_tiles(element_tiles)
    rows, offsets = _outer_reads_by_tile(mapping, size, kept)
    all_intervals = rows.listed()
    tiles = sorted(set(element_tiles.tolist()))        # Builder.by_tile's order
    assert len(offsets) == len(tiles) + 1 and offsets[-1] == len(all_intervals)
    for i, (tile, lo, hi) in enumerate(zip(tiles, offsets[:-1], offsets[1:], strict=True)):
        intervals = all_intervals[lo:hi]
        np.testing.assert_array_equal(rows.of_vertex(i), intervals)
        assert (intervals[:, 0] < intervals[:, 1]).all() and (intervals[1:, 0] >= intervals[:-1, 1]).all()
        got = np.concatenate([np.arange(a, z) for a, z in intervals])
        o = np.flatnonzero(element_tiles == tile)
        want = (np.arange(size)[None, :] * kept + o[:, None]).ravel()
        np.testing.assert_array_equal(got, np.sort(want))


@pytest.mark.parametrize("shape", [(4096, 32), (16, 4096)], ids=["many-rows", "few-rows-many-columns"])
def test_outer_partials_run_where_the_rows_live(shape):
    # Each partial vertex reduces a block of rows on the tile holding it, so
    # the partial stage exchanges little of the operand (an argument mapped
    # linearly over the tiles). A vertex per output column read its column
    # from every tile: 15/16 of the operand crossed the exchange on 16 tiles.
    # With few rows (here a row per tile, so any block of 8 rows spans 8
    # tiles), the columns are split into groups, one block per tile.
    x = rng.standard_normal(shape).astype(np.float32)
    program = compile_fn(lambda x: x.sum(0), x)
    (partials,) = partial_steps(program)
    assert partials.compute_set.kernel.outer
    assert len(np.unique(partials.compute_set.vertices.tiles)) == SMALL.num_tiles
    if shape[0] > SMALL.num_tiles:
        assert partials.exchange_bytes < 0.1 * x.nbytes, (partials.exchange_bytes, x.nbytes)
    assert_matches_cpu(lambda x: x.sum(0), x, rtol=1e-5, atol=1e-4, target=SMALL)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 700), st.integers(16, 300), st.sampled_from(["sum", "max", "min"]),
       st.sampled_from([np.float32, np.float16, np.int32]), st.sampled_from([16, 64]),
       st.integers(0, 2**31))
def test_random_outer_reductions_match_cpu(rows, kept, op, dtype, tiles, seed):
    # Reductions over the leading axis of [rows, kept] (kept >= 16: the
    # outer plan) at any row count (primes pad with the init value, few rows
    # split columns into groups, one row is a single stage), on 16 and 64 tiles.
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, kept)) * 4).astype(dtype)
    fn = {"sum": lambda a: a.sum(0), "max": lambda a: a.max(0), "min": lambda a: a.min(0)}[op]
    tol = {np.float32: 1e-5, np.float16: 2e-2}.get(dtype, 0)
    assert_matches_cpu(fn, x, rtol=tol, atol=tol * max(1, rows ** 0.5), target=get_target("ipu2", num_tiles=tiles))
