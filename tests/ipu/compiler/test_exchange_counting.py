"""The cost pass's faster ways of counting a read's exchange agree exactly
with counting it interval by interval: reads given as Rows (an outer
reduction's rows), groups of vertices counted by tables over every key,
and intervals split by owner only where they cross a tile run."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import compile_fn
from jax_ipu.compiler import cost
from jax_ipu.graph.compute import Rows, VertexArray
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.programs import leaves

TILES = 16


def _mapping(draw, size: int) -> TileMapping:
    cuts = sorted(set(draw(st.lists(st.integers(1, size - 1), max_size=40))))
    starts = np.array([0, *cuts], np.int64)
    tiles = np.array(draw(st.lists(st.integers(0, TILES - 1), min_size=len(starts), max_size=len(starts))))
    return TileMapping.from_runs(size, tiles, starts)


def _by_interval(mapping, intervals, of, readers) -> tuple[np.ndarray, np.ndarray]:
    """Elements each tile sends and receives, element by element."""
    owner = mapping.element_tiles()
    sent, received = np.zeros(TILES), np.zeros(TILES)
    for (lo, hi), v in zip(intervals, of, strict=True):
        away = owner[lo:hi] != readers[v]
        np.add.at(sent, owner[lo:hi][away], 1)
        received[readers[v]] += away.sum()
    return sent, received


@st.composite
def rows_reads(draw):
    size = draw(st.integers(2, 600))
    mapping = _mapping(draw, size)
    vertices = draw(st.integers(1, 6))
    groups = draw(st.integers(1, 10))
    vertex, base, width, stride, count = [], [], [], [], []
    for _ in range(groups):
        s = draw(st.integers(1, size))
        w = draw(st.integers(0, s))
        n = draw(st.integers(0, 8))
        b = draw(st.integers(0, size - 1))
        n = min(n, max(0, (size - b - w) // s + 1)) if b + w <= size else 0
        vertex.append(draw(st.integers(0, vertices - 1)))
        base.append(b), width.append(w), stride.append(s), count.append(n)
    rows = Rows(*(np.array(a, np.int64) for a in (vertex, base, width, stride, count)))
    tiles = np.array(draw(st.lists(st.integers(0, TILES - 1), min_size=vertices, max_size=vertices)))
    return mapping, rows, tiles


@settings(max_examples=200, deadline=None)
@given(rows_reads())
def test_rows_count_as_their_intervals(read):
    mapping, rows, tiles = read
    intervals, of = rows.intervals()
    assert (intervals[:, 1] <= mapping.size).all()
    counted = cost._rows_exchange(TILES, mapping, rows, tiles)
    order = np.argsort(of, kind="stable")
    intervals, of = intervals[order], of[order]
    expected = _by_interval(mapping, intervals, of, tiles)
    if counted is not None:
        for got, want in zip(counted, expected, strict=True):
            np.testing.assert_array_equal(got, want)
    # Each vertex its own intervals, as VertexArray.grouped gives them.
    for got, want in zip(cost._read_exchange(TILES, mapping, intervals, of, tiles, np.arange(len(tiles))),
                         expected, strict=True):
        np.testing.assert_array_equal(got, want)


@st.composite
def grouped_reads(draw):
    size = draw(st.integers(2, 400))
    mapping = _mapping(draw, size)
    groups = draw(st.integers(1, 5))
    intervals, of = [], []
    for g in range(groups):
        for _ in range(draw(st.integers(0, 4))):
            lo = draw(st.integers(0, size))
            intervals.append((lo, draw(st.integers(lo, size)))), of.append(g)
    # Every group has a reader (VertexArray.grouped's groups are the readers').
    more = draw(st.lists(st.integers(0, groups - 1), max_size=6))
    group_of = np.array(draw(st.permutations([*range(groups), *more])))
    readers = len(group_of)
    tiles = np.array(draw(st.lists(st.integers(0, TILES - 1), min_size=readers, max_size=readers)))
    order = np.argsort(of, kind="stable")
    return (mapping, np.array(intervals, np.int64).reshape(-1, 2)[order], np.array(of, np.int64)[order],
            tiles, group_of)


@settings(max_examples=200, deadline=None)
@given(grouped_reads(), st.booleans())
def test_groups_count_as_each_reader_reading_its_group(read, dense):
    mapping, intervals, of, tiles, group_of = read
    # Each reader of a group reads its intervals; an owner multicasts, so
    # it sends an element once per reader on another tile.
    expected_sent, expected_received = np.zeros(TILES), np.zeros(TILES)
    for reader, g in enumerate(group_of):
        mine = of == g
        s, r = _by_interval(mapping, intervals[mine], np.zeros(int(mine.sum()), np.int64), tiles[[reader]])
        expected_sent += s
        expected_received += r
    original = cost.DENSE_KEYS, cost.DENSE_KEYS_PER_PIECE
    cost.DENSE_KEYS, cost.DENSE_KEYS_PER_PIECE = (1 << 22, 4) if dense else (0, 0)
    try:
        sent, received = cost._read_exchange(TILES, mapping, intervals, of, tiles, group_of)
    finally:
        cost.DENSE_KEYS, cost.DENSE_KEYS_PER_PIECE = original
    np.testing.assert_array_equal(sent, expected_sent)
    np.testing.assert_array_equal(received, expected_received)


def test_intervals_across_runs_are_split_by_owner():
    mapping = TileMapping.from_runs(100, np.array([3, 5, 3, 7]), np.array([0, 10, 40, 90]))
    intervals = np.array([[0, 5], [5, 45], [95, 100], [50, 50]])
    index, owners, lengths = cost._owners(mapping, intervals)
    got = sorted(zip(index.tolist(), owners.tolist(), lengths.tolist(), strict=True))
    assert got == [(0, 3, 5), (1, 3, 5), (1, 3, 5), (1, 5, 30), (2, 7, 5), (3, 3, 0)]


def _rows_match_intervals(program) -> int:
    """Checks every read given as Rows lists the same intervals per vertex
    as the read itself; the number of such reads."""
    checked = 0
    for step in leaves(program.body):
        vertices = getattr(getattr(step, "compute_set", None), "vertices", None)
        if not isinstance(vertices, VertexArray):
            continue
        for (_, intervals, offsets), rows in zip(vertices.reads, vertices.read_rows, strict=True):
            if rows is None:
                continue
            expanded, of = rows.intervals()
            for v in range(len(vertices)):
                listed = intervals[slice(*offsets[v])] if offsets.ndim == 2 else intervals[offsets[v]:offsets[v + 1]]
                assert sorted(map(tuple, listed.tolist())) == sorted(map(tuple, expanded[of == v].tolist()))
            checked += 1
    return checked


@pytest.mark.parametrize("shape", [(64, 6, 6, 48), (3, 5, 5, 40), (700, 96)])
def test_outer_reductions_rows_are_their_read_intervals(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    program = compile_fn(lambda x: (x.sum(axis=tuple(range(len(shape) - 1))),
                                    (x * x).mean(axis=tuple(range(len(shape) - 1)))), x)
    assert _rows_match_intervals(program) >= 1
