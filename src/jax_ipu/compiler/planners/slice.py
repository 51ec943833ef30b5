"""The plan of data-dependent indexing, as popops multiSlice / multiUpdate
do it: the table (what is indexed into) stays distributed where it lives,
and the indices are broadcast to every tile holding part of it.

- Slicing (gather, dynamic_slice): each table tile stages the selected
  elements it holds, then an exchange brings them to the output's tiles.
- Updating (scatter, dynamic_update_slice): the result keeps the table's
  tile mapping; the updates are broadcast with the indices, and each table
  tile applies those that land on its elements.

Which tile holds an indexed element is known only at run time, so buffers
are sized for the worst case per tile, not for the whole table: a tile
stages at most min(window, its elements) per window of a slice, and
receives each window of updates whole. The windows go in rounds (an
exchange and a sync each) so that one round's buffers stay within
ROUND_BUFFER_SHARE of a tile's SRAM; a window bigger than that goes in
parts. Cycles assume the indices spread evenly over the table's tiles:
a tile sends its share of the output, at least one window's part."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph.compute import DataDependentExchange
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.targets import Target

# Share of a tile's SRAM that one round's exchange buffers (indices, staged
# elements, received updates) may take: a planner choice, as PopLibs'
# availableMemoryProportion is; fewer rounds cost fewer syncs.
ROUND_BUFFER_SHARE = 0.1


def _bytes_per_tile(tensor: Tensor, num_tiles: int) -> np.ndarray:
    return tensor.mapping.elements_per_tile(num_tiles) * tensor.dtype.itemsize


def _multicast(sources: list, num_tiles: int) -> np.ndarray:
    """Bytes each tile sends to broadcast the sources (views; immediates
    are compiled into the vertices): once each, the exchange multicasts.
    A part of a tensor (a scalar start) is sent by its first tile."""
    sent = np.zeros(num_tiles, dtype=np.int64)
    for s in sources:
        if isinstance(s, View) and s.is_whole_tensor:
            sent += _bytes_per_tile(s.tensor, num_tiles)
        elif isinstance(s, View) and s.size:
            sent[s.tensor.mapping.tiles[0]] += s.size * s.dtype.itemsize
    return sent


def _source_bytes(sources: list) -> int:
    return sum(s.size * s.dtype.itemsize for s in sources if isinstance(s, View))


def _rounds(target: Target, windows: int, per_window: np.ndarray) -> tuple[int, np.ndarray]:
    """(rounds, one round's buffer bytes per tile) for `windows` windows
    needing per_window bytes of buffers on each tile."""
    budget = max(int(ROUND_BUFFER_SHARE * target.bytes_per_tile), 1)
    worst = int(per_window.max(initial=0))
    if worst == 0:
        return 1, per_window
    if worst <= budget:
        together = min(windows, budget // worst)
        return -(-windows // together), per_window * together
    parts = -(-worst // budget)
    return windows * parts, -(-per_window // parts)


def plan_slice(target: Target, table: Tensor, out: Tensor, windows: int, window: int,
               broadcast: list) -> tuple[DataDependentExchange, np.ndarray]:
    """Gather or dynamic_slice of `windows` windows of `window` elements
    each from `table` into `out`, the indices (views or immediates) in
    `broadcast`. Returns the exchange and the elements each tile stages."""
    tiles = target.num_tiles
    held = table.mapping.elements_per_tile(tiles)
    holds = held > 0
    index_bytes = -(-_source_bytes(broadcast) // windows)
    itemsize = table.dtype.itemsize
    per_window = np.where(holds, index_bytes + np.minimum(window, held) * itemsize, 0)
    rounds, buffers = _rounds(target, windows, per_window)
    # Staged (and sent): a tile's even share of the output, at least one
    # window's part when it holds any of the table, never more than all.
    share = -(-out.size * held // max(table.size, 1))
    staged = np.where(holds, np.minimum(np.maximum(share, np.minimum(window, held)), out.size), 0)
    sent = staged * itemsize + _multicast(broadcast, tiles)
    received = _bytes_per_tile(out, tiles) + np.where(holds, windows * index_bytes, 0)
    return DataDependentExchange(rounds, sent, received, buffers), staged


def plan_update(target: Target, table: Tensor, windows: int, window: int, broadcast: list,
                updates: list[View]) -> tuple[DataDependentExchange, np.ndarray]:
    """Scatter or dynamic_update_slice of `windows` windows of `window`
    elements of each of `updates` into the result `table` (mapped as the
    operand), indices in `broadcast`. Returns the exchange and the update
    elements each tile applies."""
    tiles = target.num_tiles
    held = table.mapping.elements_per_tile(tiles)
    holds = held > 0
    index_bytes = -(-_source_bytes(broadcast) // windows)
    update_bytes = window * sum(u.dtype.itemsize for u in updates)
    per_window = np.where(holds, index_bytes + update_bytes, 0)
    rounds, buffers = _rounds(target, windows, per_window)
    share = -(-windows * window * held // max(table.size, 1))
    applied = np.where(holds, np.minimum(np.maximum(share, np.minimum(window, held)), windows * window), 0)
    sent = _multicast(list(broadcast) + list(updates), tiles)
    received = np.where(holds, windows * (index_bytes + update_bytes), 0)
    return DataDependentExchange(rounds, sent, received, buffers), applied
