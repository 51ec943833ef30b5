"""The cost pass's faster ways of counting a read's exchange agree exactly
with counting it interval by interval: reads given as Rows (an outer
reduction's rows), as SharedRows (a convolution's input regions) or as
ReadOnce (partials and element-wise inputs, from the two mappings' runs),
groups of vertices counted by tables over every key, intervals split by
owner only where they cross a tile run, and intervals that meet many runs
counted without splitting them."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import compile_fn
from jax_ipu.compiler import cost
from jax_ipu.compiler.lowering.conv import rect_intervals
from jax_ipu.graph.compute import ReadOnce, Rows, SharedRows, VertexArray, interval_array
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


@contextlib.contextmanager
def counting(how: str):
    """_read_exchange splitting intervals by owner, or never (_covered_exchange)."""
    original = cost.PIECES_PER_ITEM
    cost.PIECES_PER_ITEM = float("inf") if how == "split" else -1
    try:
        yield
    finally:
        cost.PIECES_PER_ITEM = original


@pytest.mark.parametrize("how", ["split", "covered"])
@settings(max_examples=200, deadline=None)
@given(read=rows_reads())
def test_rows_count_as_their_intervals(read, how):
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
    with counting(how):
        counted = cost._read_exchange(TILES, mapping, intervals, of, tiles, np.arange(len(tiles)))
    for got, want in zip(counted, expected, strict=True):
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


def _by_reader(mapping, intervals, of, tiles, group_of):
    """Each reader of a group reads its intervals; an owner multicasts, so
    it sends an element once per reader on another tile."""
    expected_sent, expected_received = np.zeros(TILES), np.zeros(TILES)
    for reader, g in enumerate(group_of):
        mine = of == g
        s, r = _by_interval(mapping, intervals[mine], np.zeros(int(mine.sum()), np.int64), tiles[[reader]])
        expected_sent += s
        expected_received += r
    return expected_sent, expected_received


@settings(max_examples=200, deadline=None)
@pytest.mark.parametrize("how", ["split", "covered"])
@given(read=grouped_reads(), dense=st.booleans())
def test_groups_count_as_each_reader_reading_its_group(read, dense, how):
    mapping, intervals, of, tiles, group_of = read
    expected_sent, expected_received = _by_reader(mapping, intervals, of, tiles, group_of)
    original = cost.DENSE_KEYS, cost.DENSE_KEYS_PER_PIECE
    cost.DENSE_KEYS, cost.DENSE_KEYS_PER_PIECE = (1 << 22, 4) if dense else (0, 0)
    try:
        with counting(how):
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
        for (tensor, intervals, offsets), rows in zip(vertices.reads, vertices.read_rows, strict=True):
            if rows is None:
                continue
            intervals = interval_array(intervals)     # (RowIntervals listed)
            if isinstance(rows, ReadOnce):
                # Each element read once, on the tile of its reading mapping's element.
                elements = np.zeros(tensor.size, np.int64)
                reader = rows.mapping.element_tiles()
                for v in range(len(vertices)):
                    for lo, hi in intervals[offsets[v]:offsets[v + 1]].tolist():
                        elements[lo:hi] += 1
                        q = np.arange(lo, hi)
                        assert (reader[(q // rows.inner) % rows.mapping.size] == vertices.tiles[v]).all()
                assert (elements == 1).all()
                checked += 1
                continue
            expanded, of = (rows.rows if isinstance(rows, SharedRows) else rows).intervals()
            for v in range(len(vertices)):
                listed = intervals[slice(*offsets[v])] if offsets.ndim == 2 else intervals[offsets[v]:offsets[v + 1]]
                mine = of == (rows.region[v] if isinstance(rows, SharedRows) else v)
                assert sorted(map(tuple, listed.tolist())) == sorted(map(tuple, expanded[mine].tolist()))
            checked += 1
    return checked


@pytest.mark.parametrize("shape", [(64, 6, 6, 48), (3, 5, 5, 40), (700, 96)])
def test_outer_reductions_rows_are_their_read_intervals(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    program = compile_fn(lambda x: (x.sum(axis=tuple(range(len(shape) - 1))),
                                    (x * x).mean(axis=tuple(range(len(shape) - 1)))), x)
    assert _rows_match_intervals(program) >= 1


@st.composite
def shared_rows_reads(draw):
    """Regions as Rows (rows.vertex naming the region) and the region each
    reader reads."""
    mapping, rows, _ = draw(rows_reads())
    regions = int(rows.vertex.max()) + 1
    more = draw(st.lists(st.integers(0, regions - 1), max_size=6))
    region = np.array(draw(st.permutations([*range(regions), *more])), np.int64)
    tiles = np.array(draw(st.lists(st.integers(0, TILES - 1), min_size=len(region), max_size=len(region))))
    return mapping, SharedRows(rows, region), tiles


@settings(max_examples=200, deadline=None)
@given(shared_rows_reads(), st.booleans())
def test_shared_rows_count_as_each_reader_reading_its_region(read, dense):
    mapping, shared, tiles = read
    intervals, of = shared.rows.intervals()
    expected = _by_reader(mapping, intervals, of, tiles, shared.region)
    original = cost.DENSE_KEYS, cost.DENSE_KEYS_PER_PIECE
    cost.DENSE_KEYS, cost.DENSE_KEYS_PER_PIECE = (1 << 22, 4) if dense else (0, 0)
    try:
        counted = cost._shared_rows_exchange(TILES, mapping, shared, tiles)
    finally:
        cost.DENSE_KEYS, cost.DENSE_KEYS_PER_PIECE = original
    if counted is not None:     # (None: the rows meet more runs than they have rows)
        for got, want in zip(counted, expected, strict=True):
            np.testing.assert_array_equal(got, want)


def _once_intervals(size: int, once: ReadOnce, tiles: np.ndarray):
    """A ReadOnce's read as intervals, one element each, by reading vertex
    (a vertex per tile of `tiles`)."""
    q = np.arange(size)
    reader = once.mapping.element_tiles()[(q // once.inner) % once.mapping.size].astype(np.int64)
    vertex = np.searchsorted(tiles, reader)
    order = np.argsort(vertex, kind="stable")
    return np.stack([q, q + 1], axis=1)[order], vertex[order]


@st.composite
def once_reads(draw):
    by_size = draw(st.integers(1, 60))
    by = _mapping(draw, by_size) if by_size > 1 else TileMapping.from_runs(1, np.array([draw(st.integers(0, TILES - 1))]), np.zeros(1, np.int64))
    inner = draw(st.integers(1, 4))
    copies = draw(st.integers(0, 5))
    size = by_size * inner * copies
    mapping = _mapping(draw, size) if size > 1 else TileMapping.from_runs(size, np.zeros(size, np.int64), np.zeros(size, np.int64))
    return mapping, ReadOnce(by, inner)


@settings(max_examples=300, deadline=None)
@given(once_reads(), st.sampled_from([None, True, False]))
def test_reads_once_count_as_their_intervals(read, merge):
    mapping, once = read
    counted = cost._once_exchange(TILES, mapping, once, merge)
    tiles = np.arange(TILES)
    intervals, of = _once_intervals(mapping.size, once, tiles)
    expected = _by_interval(mapping, intervals, of, tiles)
    for got, want in zip(counted, expected, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("merge", [True, False])
def test_reads_once_by_hand(merge):
    # partials [3 copies of 4]: tiles 0,0,1,1 | 1,1,2,2 | 2,0,0,0; outputs: 0,0 on tile 0, 2,3 on tile 1.
    partials = TileMapping.from_runs(12, np.array([0, 1, 2, 0]), np.array([0, 2, 6, 9]))
    outputs = TileMapping.from_runs(4, np.array([0, 1]), np.array([0, 2]))
    sent, received = cost._once_exchange(4, partials, ReadOnce(outputs), merge)
    # Held: tile 0 5, tile 1 4, tile 2 3. Kept: tile 0 positions 0, 1 and 9, tile 1 positions 2, 3.
    np.testing.assert_array_equal(sent, [5 - 3, 4 - 2, 3, 0])
    np.testing.assert_array_equal(received, [6 - 3, 6 - 2, 0, 0])
    # One run each (a single run reading itself), and empty tensors.
    one = TileMapping.from_runs(8, np.array([3]), np.array([0]))
    np.testing.assert_array_equal(cost._once_exchange(4, one, ReadOnce(one), merge)[0], [0, 0, 0, 0])
    twice = cost._once_exchange(4, TileMapping.from_runs(16, np.array([2]), np.array([0])), ReadOnce(one), merge)
    np.testing.assert_array_equal(twice[0], [0, 0, 16, 0])
    np.testing.assert_array_equal(twice[1], [0, 0, 0, 16])
    empty = TileMapping(0, [], [], [])
    assert cost._once_exchange(4, one, ReadOnce(empty), merge) is None
    sent, received = cost._once_exchange(4, empty, ReadOnce(one), merge)
    assert not sent.any() and not received.any()
    # Not whole copies of the reading mapping: not counted this way.
    assert cost._once_exchange(4, TileMapping.from_runs(12, np.array([3]), np.array([0])), ReadOnce(one)) is None


def test_many_runs_per_interval_are_counted_without_pieces():
    # A vector on 50 tiles (a run each of 2 elements) read whole by 3
    # vertices of one group, and in halves by two others.
    mapping = TileMapping.linear(100, TILES * 4, min_elements_per_tile=2)
    mapping = TileMapping(100, mapping.tiles % TILES, mapping.starts, mapping.stops)
    intervals = np.array([[0, 100], [0, 50], [50, 100]])
    of, group_of = np.array([0, 1, 2]), np.array([0, 0, 0, 1, 2])
    tiles = np.array([0, 5, 5, 9, 15])
    expected = _by_reader(mapping, intervals, of, tiles, group_of)
    count = 3
    for got, want in zip(cost._covered_exchange(TILES, mapping, intervals, of, tiles, group_of, count),
                         expected, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(cost._read_exchange(TILES, mapping, intervals, of, tiles, group_of), expected,
                         strict=True):
        np.testing.assert_array_equal(got, want)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_boxes_rows_are_their_intervals(data):
    dims = data.draw(st.integers(1, 4))
    sizes = np.array(data.draw(st.lists(st.integers(1, 5), min_size=dims, max_size=dims)), np.int64)
    boxes = data.draw(st.integers(1, 6))
    lows, highs = [], []
    for _ in range(boxes):
        lo = [data.draw(st.integers(0, int(n))) for n in sizes]
        lows.append(lo)
        highs.append([data.draw(st.integers(a, int(n))) for a, n in zip(lo, sizes, strict=True)])
    lows, highs = np.array(lows, np.int64), np.array(highs, np.int64)
    intervals, offsets, rows = rect_intervals(sizes, lows, highs, with_rows=True)
    assert ((rows.width <= rows.stride) | (rows.count <= 1)).all()
    listed, box = rows.intervals()
    for i in range(boxes):
        assert sorted(map(tuple, intervals[offsets[i]:offsets[i + 1]].tolist())) == \
            sorted(map(tuple, listed[box == i].tolist()))


def _kinds(program) -> set:
    return {type(rows).__name__ for step in leaves(program.body)
            for rows in getattr(getattr(getattr(step, "compute_set", None), "vertices", None), "read_rows", ())
            if rows is not None}


def test_convolution_reads_as_told_the_cost_pass():
    """A convolution's input regions (SharedRows), its partials' sum
    (ReadOnce) and an element-wise step (ReadOnce) list the intervals their
    reads hold."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 9, 9, 24)).astype(np.float32)
    w = rng.standard_normal((3, 3, 24, 40)).astype(np.float32)

    def f(x, w):
        import jax
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.numpy.maximum(y, 0.0) * 2.0 + y
    program = compile_fn(f, x, w)
    assert {"SharedRows", "ReadOnce"} <= _kinds(program)
    assert _rows_match_intervals(program) >= 2
