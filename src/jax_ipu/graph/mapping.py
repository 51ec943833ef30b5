"""Tile mappings: which tile holds each element of a tensor (Poplar's
Graph::setTileMapping), as sorted intervals of the flattened elements."""
from __future__ import annotations

import numpy as np


def _compact(tiles: np.ndarray) -> type:
    """The smallest integer type of a per-element tile array."""
    return np.uint16 if tiles.size == 0 or int(tiles.max()) <= np.iinfo(np.uint16).max else np.int64


# Tensors of fewer elements than this keep their runs' starts and stops as
# int32 (sums of two positions still fit).
INT32_POSITIONS = 1 << 30


class TileMapping:
    """Intervals [starts[i], stops[i]) of a tensor's flattened elements held
    by tiles[i]; sorted, touching, covering every element exactly once for a
    valid mapping (graph.validate checks that)."""

    __slots__ = ("size", "tiles", "starts", "stops", "_element_tiles", "_by_tile", "_per_tile")

    def __init__(self, size: int, tiles, starts, stops):
        self.size = size
        # int32 where the positions leave int32 room to spare: the runs of a
        # convolutional network's partials took most of its compile's host
        # memory as int64.
        positions = np.int32 if size < INT32_POSITIONS else np.int64
        self.tiles = np.asarray(tiles, dtype=np.int32)
        self.starts = np.asarray(starts, dtype=positions)
        self.stops = np.asarray(stops, dtype=positions)
        self._element_tiles = None
        self._by_tile = None
        self._per_tile = None

    def same_runs(self, other: TileMapping) -> bool:
        """Whether other lists the same runs on the same tiles (not merely
        the same tile for every element)."""
        return other is self or (other.size == self.size and np.array_equal(other.tiles, self.tiles)
                                 and np.array_equal(other.starts, self.starts)
                                 and np.array_equal(other.stops, self.stops))

    @classmethod
    def linear(cls, size: int, num_tiles: int, grain: int = 1, min_elements_per_tile: int = 1,
               first_tile: int = 0) -> TileMapping:
        """Poplar's mapTensorLinearly: equal runs of whole grains on
        consecutive tiles, none smaller than min_elements_per_tile (so that a
        tile's six workers get enough to do)."""
        per_tile = -(-size // max(num_tiles, 1))
        per_tile = max(per_tile, min_elements_per_tile, 1)
        per_tile = -(-per_tile // grain) * grain
        starts = np.arange(0, size, per_tile, dtype=np.int64)
        stops = np.minimum(starts + per_tile, size)
        tiles = (first_tile + np.arange(len(starts))) % num_tiles
        return cls(size, tiles, starts, stops)

    @classmethod
    def from_element_tiles(cls, element_tiles: np.ndarray) -> TileMapping:
        """Run-length encodes a tile number per element."""
        element_tiles = np.asarray(element_tiles).ravel()
        size = len(element_tiles)
        if size == 0:
            return cls(0, [], [], [])
        breaks = np.flatnonzero(np.diff(element_tiles)) + 1
        starts = np.concatenate(([0], breaks))
        stops = np.concatenate((breaks, [size]))
        mapping = cls(size, element_tiles[starts], starts, stops)
        mapping._element_tiles = element_tiles.astype(_compact(mapping.tiles), copy=False)
        return mapping

    @classmethod
    def from_runs(cls, size: int, tiles: np.ndarray, starts: np.ndarray) -> TileMapping:
        """Runs beginning at ascending `starts` (the first at 0), each up to
        the next, on `tiles`; touching runs on the same tile joined."""
        tiles, starts = np.asarray(tiles).ravel(), np.asarray(starts).ravel()
        if size == 0:
            return cls(0, [], [], [])
        keep = np.ones(len(tiles), bool)
        keep[1:] = tiles[1:] != tiles[:-1]
        starts = starts[keep]
        return cls(size, tiles[keep], starts, np.append(starts[1:], size))

    def element_tiles(self) -> np.ndarray:
        """The tile of every element, in the smallest integer type that holds
        the tile numbers (cached while compiling: mappings never change; a
        convolutional network's caches took gigabytes as int64)."""
        if self._element_tiles is None:
            self._element_tiles = np.repeat(self.tiles.astype(_compact(self.tiles)), self.stops - self.starts)
        return self._element_tiles

    @property
    def holds_element_tiles(self) -> bool:
        return self._element_tiles is not None

    def drop_element_tiles(self) -> None:
        self._element_tiles = None

    def forget(self) -> None:
        """Drops what element_tiles() and intervals_on() cached: the compiler
        calls this when the program is built (they are rebuilt on demand)."""
        self._element_tiles = None
        self._by_tile = None

    def elements_per_tile(self, num_tiles: int) -> np.ndarray:
        """Elements on each of num_tiles tiles (kept: the cost pass asks
        again for each compute set reading the tensor; not to be written)."""
        if self._per_tile is None or len(self._per_tile) != num_tiles:
            per_tile = np.bincount(self.tiles, weights=self.stops - self.starts, minlength=num_tiles).astype(np.int64)
            per_tile.setflags(write=False)
            self._per_tile = per_tile
        return self._per_tile

    def tiles_used(self) -> np.ndarray:
        return np.array(list(self._intervals_by_tile()), dtype=np.int64)

    def intervals_by_tile(self) -> dict[int, np.ndarray]:
        """tile -> its [k, 2] intervals, in ascending tile order."""
        return self._intervals_by_tile()

    def intervals_on(self, tile: int) -> np.ndarray:
        """[k, 2] array of this tile's intervals."""
        return self._intervals_by_tile().get(int(tile), np.zeros((0, 2), dtype=np.int64))

    def _intervals_by_tile(self) -> dict[int, np.ndarray]:
        """tile -> its intervals, ascending tiles, built once (mappings
        never change)."""
        if self._by_tile is None:
            order = np.argsort(self.tiles, kind="stable")
            tiles = self.tiles[order]
            pairs = np.stack([self.starts[order], self.stops[order]], axis=1)
            cuts = np.flatnonzero(np.diff(tiles)) + 1
            self._by_tile = {int(group[0]): part for group, part in
                             zip(np.split(tiles, cuts), np.split(pairs, cuts), strict=True)} if len(tiles) else {}
        return self._by_tile

    def __repr__(self) -> str:
        return f"TileMapping({self.size} elements, {len(self.tiles)} intervals on {len(self.tiles_used())} tiles)"
