"""jax_ipu.graph: tile mappings, views and the Program validator."""
from __future__ import annotations

import numpy as np
import pytest

from jax_ipu.errors import IpuCompileError
from jax_ipu.graph.compute import ComputeSet, Region, Vertex
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.validate import check_compute_set, check_mapping
from jax_ipu.graph.views import Concat, View, source_tiles


@pytest.mark.parametrize("size", [0, 1, 7, 1001, 4096])
@pytest.mark.parametrize("grain, minimum", [(1, 1), (2, 64), (4, 128)])
def test_linear_mapping_covers_every_element_once(size, grain, minimum):
    m = TileMapping.linear(size, 16, grain=grain, min_elements_per_tile=minimum)
    check_mapping(Tensor(0, "t", (size,), np.dtype(np.float32), m), 16)
    assert m.elements_per_tile(16).sum() == size
    if size:
        counts = m.stops - m.starts
        assert (counts[:-1] % grain == 0).all() and (counts[:-1] >= min(minimum, size)).all()
        assert len(m.tiles_used()) == min(16, -(-size // max(minimum, -(-size // 16))))


def test_mapping_from_element_tiles_round_trips():
    tiles = np.array([0, 0, 3, 3, 3, 1, 0, 0])
    m = TileMapping.from_element_tiles(tiles)
    np.testing.assert_array_equal(m.tiles, [0, 3, 1, 0])
    np.testing.assert_array_equal(TileMapping(8, m.tiles, m.starts, m.stops).element_tiles(), tiles)
    np.testing.assert_array_equal(m.intervals_on(0), [[0, 2], [6, 8]])


@pytest.mark.parametrize("seed", range(4))
def test_mapping_from_runs_equals_the_per_element_mapping(seed):
    rng = np.random.default_rng(seed)
    starts = np.concatenate(([0], np.sort(rng.choice(np.arange(1, 60), rng.integers(0, 20), replace=False))))
    tiles = rng.integers(0, 3, len(starts))
    element_tiles = np.repeat(tiles, np.diff(np.append(starts, 60)))
    want, got = TileMapping.from_element_tiles(element_tiles), TileMapping.from_runs(60, tiles, starts)
    for field in ("tiles", "starts", "stops"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
    assert TileMapping.from_runs(0, [], []).size == 0


def _tensor(size=10, tiles=(0, 1), starts=(0, 5), stops=(5, 10)):
    return Tensor(0, "t", (size,), np.dtype(np.float32), TileMapping(size, tiles, starts, stops))


@pytest.mark.parametrize("tiles, starts, stops, problem", [
    ((0, 1), (0, 4), (5, 10), "mapped twice"),
    ((0, 1), (0, 6), (5, 10), "mapped twice or not at all"),
    ((0, 1), (0, 5), (5, 9), "does not cover"),
    ((0, 99), (0, 5), (5, 10), "outside"),
])
def test_validator_rejects_bad_mappings(tiles, starts, stops, problem):
    with pytest.raises(IpuCompileError, match=problem):
        check_mapping(_tensor(tiles=tiles, starts=starts, stops=stops), 16)


def _vertex(tile, reads, writes):
    return Vertex("Test", tile, tuple(reads), tuple(writes), 1)


def test_validator_rejects_overlapping_writes_and_reads_of_writes():
    t, u = _tensor(), _tensor()
    ok = ComputeSet("ok", [_vertex(0, [Region(u, np.array([[0, 10]]))], [Region(t, np.array([[0, 5]]))]),
                           _vertex(1, [Region(t, np.array([[5, 10]]))], [Region(t, np.array([[5, 10]]))])], None)
    check_compute_set(ok)
    clash = ComputeSet("clash", [_vertex(0, [], [Region(t, np.array([[0, 6]]))]),
                                 _vertex(1, [], [Region(t, np.array([[5, 10]]))])], None)
    with pytest.raises(IpuCompileError, match="both write"):
        check_compute_set(clash)
    race = ComputeSet("race", [_vertex(0, [], [Region(t, np.array([[0, 5]]))]),
                               _vertex(1, [Region(t, np.array([[3, 4]]))], [Region(u, np.array([[0, 1]]))])],
                      None)
    with pytest.raises(IpuCompileError, match="reads t\\[3:4\\] which vertex 0 writes"):
        check_compute_set(race)


def test_views_apply_and_name_their_source_elements():
    t = Tensor(0, "t", (2, 3), np.dtype(np.int32), TileMapping.linear(6, 2))
    u = Tensor(1, "u", (2, 1), np.dtype(np.int32), TileMapping.linear(2, 2))
    data = {0: np.arange(6, dtype=np.int32).reshape(2, 3), 1: np.array([[10], [11]], np.int32)}
    transposed = View(t).then("transpose", (1, 0))
    assert transposed.shape == (3, 2)
    np.testing.assert_array_equal(transposed.apply(lambda x: data[x.id]), data[0].T)
    sliced = View(t).then("slice", (0, 1), (2, 3), (1, 2))
    assert sliced.shape == (2, 1)
    broadcast = View(u).then("reshape", (2,)).then("broadcast", (3, 2), (1,))
    np.testing.assert_array_equal(broadcast.apply(lambda x: data[x.id]), [[10, 11]] * 3)
    joined = Concat((View(t), View(u)), axis=1)
    assert joined.shape == (2, 4)
    # t's elements 0-2 on tile 0, 3-5 on tile 1; u's one on each.
    np.testing.assert_array_equal(source_tiles(joined), [0, 0, 0, 0, 1, 1, 1, 1])
    np.testing.assert_array_equal(source_tiles(transposed), [0, 1, 0, 1, 0, 1])
