"""Outer reductions hold their read intervals as RowIntervals (each tile's
runs of columns repeated over the reduced rows), not as lists of tens of
millions of intervals: listed, they are exactly the intervals the lists
held (the list-making code of before kept here as the reference), vertex
by vertex and as Rows for the cost pass; compiled reductions keep them so
through validation and saving, and the Model's results match XLA:CPU's."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import SMALL, assert_matches_cpu, compile_fn
from jax_ipu.compiler.lowering.reduce import _outer_reads_by_tile
from jax_ipu.graph import serialize
from jax_ipu.graph.compute import RowIntervals, VertexArray
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.graph.validate import validate
from jax_ipu.model.engine import Engine

INT32_MAX = 2**31 - 1


def listed_reads_by_tile(mapping: TileMapping, size: int, kept: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference: the intervals of the [size, kept] input behind each
    tile's outputs as the lowering listed them before RowIntervals (an
    interval per output run and row, sorted by tile, then start), int32
    where the stops fit, and CSR offsets per tile."""
    lengths = mapping.stops - mapping.starts
    o = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths - mapping.starts, lengths)
    tile = np.repeat(mapping.tiles, lengths)
    order = np.lexsort((o, tile))
    o, tile = o[order], tile[order]
    first = np.ones(len(o), bool)
    first[1:] = (tile[1:] != tile[:-1]) | (o[1:] != o[:-1] + 1)
    at = np.flatnonzero(first)
    last = np.append(at[1:], len(o)) - 1
    starts, ends, tile = o[at], o[last] + 1, tile[at]
    rows = np.arange(size) * kept
    lo, hi = (rows + starts[:, None]).ravel(), (rows + ends[:, None]).ravel()
    tile = np.repeat(tile, size)
    order = np.lexsort((lo, tile))
    lo, hi, tile = lo[order], hi[order], tile[order]
    cuts = np.flatnonzero(tile[1:] != tile[:-1]) + 1
    out = np.empty((len(lo), 2), np.int32 if hi.max(initial=0) <= INT32_MAX else np.int64)
    out[:, 0], out[:, 1] = lo, hi
    return out, (np.r_[0, cuts, len(tile)] if len(tile) else np.zeros(1, np.int64))


def check_vertex_by_vertex(rows: RowIntervals, want: np.ndarray, offsets: np.ndarray) -> None:
    """Every way of reading `rows` gives the listed intervals `want`."""
    got = rows.listed()
    assert got.dtype == want.dtype and len(rows) == len(want)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(rows.offsets(), offsets)
    vertices = VertexArray("Reduce<add,float>", np.arange(rows.num_vertices), np.zeros(rows.num_vertices),
                           ((None, rows, offsets),))
    (_, held, of, _, _), = vertices.region_groups("reads")
    np.testing.assert_array_equal(held, want)
    np.testing.assert_array_equal(of, np.repeat(np.arange(rows.num_vertices), np.diff(offsets)))
    as_rows, vertex = vertices.read_rows[0].intervals()         # what the cost pass reads
    for v in range(rows.num_vertices):
        mine = want[offsets[v]:offsets[v + 1]]
        np.testing.assert_array_equal(vertices[v].reads[0].intervals, mine)
        np.testing.assert_array_equal(np.sort(as_rows[vertex == v], axis=0), np.sort(mine.astype(np.int64), axis=0))


@settings(max_examples=60, deadline=None)
@given(kept=st.integers(1, 80), size=st.integers(1, 12), tiles=st.integers(1, 7), long_run=st.booleans(),
       seed=st.integers(0, 2**16))
def test_row_intervals_list_what_the_reads_listed(kept, size, tiles, long_run, seed):
    rng = np.random.default_rng(seed)
    element_tiles = rng.integers(0, tiles, kept)
    if long_run:
        element_tiles[: kept // 2] = tiles - 1       # runs that touch on one tile
    mapping = TileMapping.from_element_tiles(element_tiles)
    rows, offsets = _outer_reads_by_tile(mapping, size, kept)
    want, want_offsets = listed_reads_by_tile(mapping, size, kept)
    np.testing.assert_array_equal(offsets, want_offsets)
    check_vertex_by_vertex(rows, want, offsets)
    # What they hold grows with the runs of columns, not with the rows.
    assert rows.nbytes == _outer_reads_by_tile(mapping, size * 1000, kept)[0].nbytes


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 9)), max_size=4), min_size=1, max_size=6),
       count=st.integers(0, 7), big=st.booleans())
def test_any_row_intervals_list_row_after_row(runs, count, big):
    # Vertex v's runs [start, start + width), in each row i < count, shifted
    # by i * stride: a stride near 2**31 makes the listed stops int64.
    starts, stops, cuts, strides = [], [], [0], []
    for vertex in runs:
        for start, width in vertex:
            starts.append(start)
            stops.append(start + width)
        cuts.append(len(starts))
        strides.append((INT32_MAX // max(count - 1, 1) - 30) if big else 64)
    rows = RowIntervals(starts, stops, cuts, np.full(len(runs), count), strides)
    want = [[(a + i * s, z + i * s) for i in range(count) for a, z in zip(starts[c0:c1], stops[c0:c1], strict=True)]
            for c0, c1, s in zip(cuts[:-1], cuts[1:], strides, strict=True)]
    offsets = np.r_[0, np.cumsum([len(w) for w in want])]
    flat = np.array([pair for w in want for pair in w], np.int64).reshape(-1, 2)
    dtype = np.int32 if flat[:, 1].max(initial=0) <= INT32_MAX else np.int64
    check_vertex_by_vertex(rows, flat.astype(dtype), offsets)


def row_reads(program) -> list:
    """(step, RowIntervals) of every outer reduction read held as rows."""
    return [(s, iv) for s in leaves(program.body) if isinstance(s, Execute)
            and isinstance(s.compute_set.vertices, VertexArray)
            for _, iv, _ in s.compute_set.vertices.reads if isinstance(iv, RowIntervals)]


REDUCTIONS = {
    "sum": lambda x: jnp.sum(x, axis=0),
    "max": lambda x: jnp.max(x, axis=(0, 1)),
    "mean and variance": lambda x: (jnp.mean(x, axis=(0, 1)), jnp.var(x, axis=(0, 1))),
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(REDUCTIONS)), batch=st.integers(1, 40), field=st.integers(1, 12),
       channels=st.sampled_from([16, 17, 48, 130]), dtype=st.sampled_from([np.float32, np.float16]),
       seed=st.integers(0, 2**16))
def test_random_outer_reductions_match_xla_cpu_and_survive_saving(name, batch, field, channels, dtype, seed):
    x = np.random.default_rng(seed).standard_normal((batch, field, channels)).astype(dtype)
    f = REDUCTIONS[name]
    program = compile_fn(f, x)
    validate(program)
    got = Engine(SMALL).run(program, [x])
    tolerance = 1e-4 if dtype == np.float32 else 4e-3
    assert_matches_cpu(f, x, got=got, rtol=tolerance, atol=tolerance)
    loaded, _ = serialize.loads(serialize.dumps(program))
    for a, b in zip(got, Engine(SMALL).run(loaded, [x]), strict=True):
        np.testing.assert_array_equal(a, b)
    held = {id(s) for s, _ in row_reads(program)}
    steps = [[s for s in leaves(p.body) if isinstance(s, Execute)] for p in (program, loaded)]
    for mine, theirs in zip(*steps, strict=True):
        if id(mine) in held:
            held.remove(id(mine))
            for u, v in zip(mine.compute_set.vertices, theirs.compute_set.vertices, strict=True):
                for ra, rb in zip(u.reads + u.writes, v.reads + v.writes, strict=True):
                    np.testing.assert_array_equal(ra.intervals, rb.intervals)
    assert not held


@pytest.mark.parametrize("shape", [(4096, 32), (16, 4096), (64, 7, 7, 64)],
                         ids=["many-rows", "few-rows-many-columns", "batch-norm"])
def test_outer_reductions_hold_rows_not_lists(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    f = (lambda x: jnp.sum(x, axis=tuple(range(x.ndim - 1))))
    program = compile_fn(f, x)
    reads = row_reads(program)
    assert reads
    assert sum(rows.nbytes for _, rows in reads) < sum(rows.listed().nbytes for _, rows in reads)
    assert_matches_cpu(f, x, got=Engine(SMALL).run(program, [x]), rtol=1e-5, atol=2e-4)


def test_the_reduction_through_the_plugin_matches_xla_cpu(ipu):
    x = np.random.default_rng(2).standard_normal((20, 14, 14, 64)).astype(np.float16)
    assert_matches_cpu(lambda x: (jnp.mean(x, axis=(0, 1, 2)), jnp.max(x, axis=(0, 1, 2))), x,
                       device=ipu, rtol=2e-3, atol=2e-3)


def _spoil(attribute: str, change):
    """A saved outer reduction whose RowIntervals had `attribute` changed
    before saving (the bytes as a forger would write them, the checksum good)."""
    x = np.random.default_rng(3).standard_normal((4096, 32)).astype(np.float32)
    program = compile_fn(lambda x: jnp.sum(x, axis=0), x)
    (_, rows), *_ = row_reads(program)
    setattr(rows, attribute, change(getattr(rows, attribute)))
    return serialize.dumps(program)


@pytest.mark.parametrize("attribute, change, words", [
    ("count", lambda c: c + 1, "reaches beyond"),
    ("count", lambda c: c * 0, "fewer than one row"),
    ("stride", lambda s: s * 0, "overlapping rows"),
    ("stride", lambda s: -s, "negative stride"),
    ("starts", lambda a: a - 1 - a.max(), "starts below 0"),
])
def test_forged_row_blocks_are_refused_when_first_read(attribute, change, words):
    # A block of rows is listed only within its tensor, so that no saved
    # entry can make loading list more intervals than its tensors hold.
    program, _ = serialize.loads(_spoil(attribute, change))
    for _ in range(2):
        with pytest.raises(serialize.ProgramFormatError, match=words):
            for step in leaves(program.body):
                if isinstance(step, Execute):
                    list(step.compute_set.vertices)


def test_a_saved_outer_reduction_validates_as_compiled():
    program, _ = serialize.loads(_spoil("count", lambda c: c))
    validate(program)
