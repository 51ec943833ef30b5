"""How the compiler lays tensors over tiles when no plan says otherwise:
linearly, in whole 64-bit grains, at least MIN_BYTES_PER_TILE a tile so
that each tile's six workers get whole vectors to work on."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph.mapping import TileMapping
from jax_ipu.targets import Target

MIN_BYTES_PER_TILE = 256


def linear(target: Target, size: int, dtype: np.dtype) -> TileMapping:
    itemsize = np.dtype(dtype).itemsize
    grain = max(1, target.vector_bytes // itemsize)
    return TileMapping.linear(size, target.num_tiles, grain=grain,
                              min_elements_per_tile=max(1, MIN_BYTES_PER_TILE // itemsize))


def spread(target: Target, size: int) -> TileMapping:
    """One element per tile first: for work items (partials) that each
    stand for many elements."""
    return TileMapping.linear(size, target.num_tiles)
