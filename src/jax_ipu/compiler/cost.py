"""Cycle estimates: vertices (workers, vector and AMP rates, supervisor
overhead), exchanges (busiest tile's bytes over the exchange rate plus a
fixed cost) and syncs. A compute set takes as long as its slowest tile."""
from __future__ import annotations

import math

import numpy as np

from jax_ipu import ops_complex
from jax_ipu.graph import programs as p
from jax_ipu.graph.compute import (
    ReadOnce,
    Rows,
    SharedRows,
    VertexArray,
    range_index,
    region_groups,
    spans,
    vertex_cycles,
    vertex_tiles,
)
from jax_ipu.graph.programs import CONTROL, Copy, Execute, HostCall, leaves
from jax_ipu.graph.views import Concat, View, apply_ops, source_tiles, window_outputs
from jax_ipu.ops import cycles_per_vector, emulates
from jax_ipu.targets import BFLOAT16, Target


def worker_cycles(target: Target, n: int, per_vector: float, vector_width: int) -> int:
    """Cycles for n elements split over the tile's workers: each worker
    issues once every `workers` cycles (round robin), so work on fewer than
    six workers leaves issue slots empty."""
    if n <= 0:
        return 0
    w = target.workers_per_tile
    per_worker = -(-n // w)
    return int(-(-per_worker // vector_width) * per_vector * w)


def elementwise_cycles(target: Target, n: int, dtype: np.dtype, ops: list[str]) -> int:
    per_vector = cycles_per_vector(ops)
    return target.supervisor_cycles + worker_cycles(target, n, per_vector, target.vector_width(dtype))


_F32 = np.dtype(np.float32)


def emulated_cycles_per_element(target: Target, op: str, operand_dtypes, dtype: np.dtype) -> float:
    """A worker's issue cycles for one element of an element-wise op on an
    emulated type (docs/ipu.md, "Emulated types"), or 0 for a native op.
    bfloat16: each bfloat16 operand widened and a bfloat16 result rounded
    (integer instructions, one element each), around the float32 op at the
    float32 vector width. complex64: the float32 ops it expands to
    (ops_complex.COMPONENTS), two lanes a cycle, plus lane permutes for
    ops that mix the real and imaginary parts."""
    kind = emulates(op, operand_dtypes, dtype)
    lanes = target.vector_width(_F32)
    if kind == "bfloat16":
        integer = (target.bf16_widen_cycles * sum(np.dtype(d) == BFLOAT16 for d in operand_dtypes)
                   + (target.bf16_round_cycles if np.dtype(dtype) == BFLOAT16 else 0))
        return integer / target.int_elements_per_cycle + cycles_per_vector([op]) / lanes
    if kind == "complex64":
        components = ops_complex.COMPONENTS.get(op, {})
        real_ops = sum(count * cycles_per_vector([name]) for name, count in components.items()) / lanes
        mixes = op not in ops_complex.BY_PARTS and op not in ("select", "convert")
        return real_ops + (target.complex_permute_cycles if mixes else 0)
    return 0.0


def chain_cycles(target: Target, n: int, dtype: np.dtype, instructions: list[tuple]) -> tuple[int, list[float]]:
    """A fused chain's vertex over n elements: (cycles, the cycles of each
    instruction's emulation). instructions: (op, operand dtypes, dtype);
    the native ones cost as elementwise_cycles at the chain's vector width,
    the emulated ones their emulated_cycles_per_element each."""
    per_element = [emulated_cycles_per_element(target, op, operands, out) for op, operands, out in instructions]
    native = [op for (op, _, _), emulated in zip(instructions, per_element, strict=True) if not emulated]
    emulated = [worker_cycles(target, n, c, 1) if c else 0 for c in per_element]
    return elementwise_cycles(target, n, dtype, native) + sum(emulated), emulated


def matmul_cycles(target: Target, macs, dtype: np.dtype, partials: np.dtype | None = None):
    """A tile's partial product of `macs` multiply-adds (a number or an
    array of them) into `partials` (float32 by default for float inputs).
    AMP: amp_fixed_cycles + macs / amp_macs_per_cycle; integers have no
    AMP: one multiply-add a cycle (six workers, each issuing every sixth
    cycle)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return target.amp_fixed_cycles + macs / amp_macs_per_cycle(target, dtype, partials)
    return target.supervisor_cycles + macs


def amp_macs_per_cycle(target: Target, dtype: np.dtype, partials: np.dtype | None = None) -> float:
    """A tile's AMP multiply-adds a cycle for float `dtype` inputs into
    `partials` (docs/ipu.md): float16 inputs as PopLibs' convolution
    vertices run them, its conv units (target.conv_units: 16 with float16
    partials, 8 with float32 ones on ipu2) each taking a chain of
    conv_unit_chain_length 64-bit loads of inputs (16 float16) per output
    position every conv_unit_chain_length cycles: 64 and 32 a cycle. Float32
    inputs at the datasheet's fp32_flops_per_cycle / 2."""
    dtype = np.dtype(dtype)
    if dtype.itemsize == 4:
        return target.fp32_flops_per_cycle / 2
    partials = np.dtype(np.float32) if partials is None else np.dtype(partials)
    inputs_per_unit = target.conv_unit_chain_length * target.conv_input_load_bytes // dtype.itemsize
    return target.conv_units(dtype, partials) * inputs_per_unit / target.conv_unit_chain_length


def reduce_cycles(target: Target, n: int, dtype: np.dtype) -> int:
    """n elements combined in pairs; bfloat16 ones widened to float32 first."""
    widen = worker_cycles(target, n, target.bf16_widen_cycles, target.int_elements_per_cycle) \
        if np.dtype(dtype) == BFLOAT16 else 0
    return target.supervisor_cycles + worker_cycles(target, n, 1, target.vector_width(dtype)) + widen


def exchange_cycles(target: Target, sent: np.ndarray, received: np.ndarray) -> int:
    busiest = max(int(sent.max(initial=0)), int(received.max(initial=0)))
    if busiest == 0:
        return 0
    return target.exchange_fixed_cycles + -(-busiest // target.exchange_bytes_per_cycle)


def _owners(mapping, intervals: np.ndarray, ascending: bool = False) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Splits read intervals by the tiles that hold them: (the read
    interval of each piece, or None when each lies within one run and is
    its own piece; then per piece the owning tile and element count).
    Pieces come in no particular order: the intervals within one run
    first (nearly all of a convolution's or a reduction's rows), then the
    pieces of those across runs, split apart (splitting every interval
    took most of a large program's costing). ascending: the intervals'
    starts ascend (then no search per interval)."""
    lo, hi = intervals[:, 0], intervals[:, 1]
    if not len(mapping.starts):     # an empty tensor: its reads are empty too
        return None, np.zeros(len(lo), mapping.tiles.dtype), hi - lo
    first = _run_index(mapping.stops, lo) if ascending else np.searchsorted(mapping.stops, lo, side="right")
    # Within run `first` alone when it starts before hi and stops at or
    # after it (the runs touch: the next starts there); a second search
    # only for the others.
    run = np.minimum(first, len(mapping.starts) - 1)
    single = (first < len(mapping.starts)) & (mapping.starts[run] < hi) & (mapping.stops[run] >= hi)
    if single.all():   # each within one run (or no intervals)
        return None, mapping.tiles[first], hi - lo
    one = np.flatnonzero(single)
    others = np.flatnonzero(~single)
    pieces = np.searchsorted(mapping.starts, hi[others], side="left") - first[others]
    several = others[pieces > 1]
    counts = pieces[pieces > 1]
    held = spans(first[several], first[several] + counts)
    at = np.repeat(several, counts)
    lengths = np.minimum(hi[at], mapping.stops[held]) - np.maximum(lo[at], mapping.starts[held])
    return (np.concatenate([one, at]), np.concatenate([mapping.tiles[first[one]], mapping.tiles[held]]),
            np.concatenate([(hi[one] - lo[one]).astype(lengths.dtype, copy=False), lengths]))


# Keys (group x tile) up to which _read_exchange counts by tables over all
# keys, if there are at most DENSE_KEYS_PER_PIECE as many as pieces: a
# table far larger than the pieces costs more than sorting them.
DENSE_KEYS = 1 << 16
DENSE_KEYS_PER_PIECE = 4


# Pieces (read intervals split by owner) per interval, reader and run
# beyond which _read_exchange counts without pieces (_covered_exchange).
PIECES_PER_ITEM = 4


def _read_exchange(num_tiles: int, mapping, intervals, of, readers, groups) -> tuple[np.ndarray, np.ndarray]:
    """Elements each tile sends and receives for one region of a tensor's
    reads: intervals, the group of each, the reading vertices' tiles and
    their groups (see VertexArray.region_groups). A reader receives what
    its tile does not hold; an owner sends its piece to each reader on
    another tile. A group read by several vertices is split by owner once.
    Intervals that each meet many runs are not split (_covered_exchange)."""
    if len(intervals) and mapping.size:
        count = max(int(of.max()) + 1, int(groups.max()) + 1 if len(groups) else 0)
        pieces = int((intervals[:, 1] - intervals[:, 0]).sum(dtype=np.int64)) * len(mapping.starts) / mapping.size
        if pieces > PIECES_PER_ITEM * (len(intervals) + len(mapping.starts) + len(readers) * len(intervals) / count):
            return _covered_exchange(num_tiles, mapping, intervals, of, readers, groups, count)
    index, owners, lengths = _owners(mapping, intervals)

    def per_piece(values):
        return values if index is None else values[index]
    if np.array_equal(groups, np.arange(len(groups))):   # each vertex its own intervals
        # What stays on a tile is neither sent nor received: owners send
        # all they hold less it, readers receive all they read less it.
        reader = readers[of]
        lengths = lengths.astype(np.float64)      # (once: bincount converts its weights)
        local = per_piece(reader) == owners
        kept = np.bincount(owners[local], weights=lengths[local], minlength=num_tiles)
        read = lengths if index is None else (intervals[:, 1] - intervals[:, 0]).astype(np.float64)
        return (np.bincount(owners, weights=lengths, minlength=num_tiles) - kept,
                np.bincount(reader, weights=read, minlength=num_tiles) - kept)
    # (A group may read nothing: a kernel block that meets only padding.)
    count = max(int(of.max()) + 1 if len(of) else 0, int(groups.max()) + 1 if len(groups) else 0)
    size = np.bincount(of, weights=intervals[:, 1] - intervals[:, 0], minlength=count)
    return _grouped_exchange(num_tiles, per_piece(of), owners, lengths, size, readers, groups, count)


def _grouped_exchange(num_tiles: int, of, owners, lengths, size, readers, groups, count: int):
    """_read_exchange of pieces (per piece its group, owner and elements;
    size: each group's elements) read by vertices in groups."""
    # Elements of each group held by each tile, keyed group * tiles + tile.
    piece_keys = of * num_tiles + owners
    reader_keys = groups * num_tiles + readers
    per_group = np.bincount(groups, minlength=count)
    if count * num_tiles <= max(DENSE_KEYS, DENSE_KEYS_PER_PIECE * len(piece_keys)):
        # Tables over every key (bincounts), not sorted keys (np.unique's
        # sorts were most of a large program's costing).
        table = count * num_tiles
        keys = np.flatnonzero(np.bincount(piece_keys, minlength=table))
        held_by_key = np.bincount(piece_keys, weights=lengths, minlength=table)
        held = held_by_key[keys]
        received = np.bincount(readers, weights=size[groups] - held_by_key[reader_keys], minlength=num_tiles)
        others = per_group[keys // num_tiles] - np.bincount(reader_keys, minlength=table)[keys]
        return np.bincount(keys % num_tiles, weights=held * others, minlength=num_tiles), received
    keys, at = np.unique(piece_keys, return_inverse=True)
    held = np.bincount(at.ravel(), weights=lengths, minlength=len(keys))

    def lookup(table, values, wanted):
        if not len(table):
            return np.zeros(len(wanted))
        i = np.minimum(np.searchsorted(table, wanted), len(table) - 1)
        return np.where(table[i] == wanted, values[i], 0)
    received = np.bincount(readers, weights=size[groups] - lookup(keys, held, reader_keys), minlength=num_tiles)
    pairs, pair_counts = np.unique(reader_keys, return_counts=True)
    others = per_group[keys // num_tiles] - lookup(pairs, pair_counts, keys)
    return np.bincount(keys % num_tiles, weights=held * others, minlength=num_tiles), received


def _covered_exchange(num_tiles: int, mapping, intervals, of, readers, groups, count: int):
    """_read_exchange without splitting intervals by owner: what the owners
    hold of the intervals, each counted once per reader of its group, from
    the integral of that count over the tensor's positions at the runs'
    ends (owners sending their pieces to every reader, readers' own tiles
    aside); what each reading tile holds of its group's intervals, from
    the tile's runs (_below)."""
    lo, hi = intervals[:, 0].astype(np.int64), intervals[:, 1].astype(np.int64)
    per_group = np.bincount(groups, minlength=count)
    size = np.bincount(of, weights=hi - lo, minlength=count)
    # Readers of the interval covering each position: a step function.
    weight = per_group[of]
    order = np.argsort(np.r_[lo, hi], kind="stable")
    at = np.r_[lo, hi][order]
    level = np.cumsum(np.r_[weight, -weight][order])
    integral = np.r_[0, np.cumsum(level[:-1] * np.diff(at))]

    def covered(x):
        i = np.searchsorted(at, x, side="right") - 1
        j = np.maximum(i, 0)
        return np.where(i >= 0, integral[j] + level[j] * (x - at[j]), 0)
    runs = covered(mapping.stops.astype(np.int64)) - covered(mapping.starts.astype(np.int64))
    sent = np.bincount(mapping.tiles, weights=runs, minlength=num_tiles)
    # Each (group, reading tile) once, with its readers.
    pairs, readers_on = np.unique(groups * num_tiles + readers, return_counts=True)
    group, tile = np.divmod(pairs, num_tiles)
    by_group = np.argsort(of, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(of, minlength=count))]
    which = by_group[spans(bounds[group], bounds[group + 1])]
    pair = range_index(bounds[group], bounds[group + 1])
    below = _below(mapping)
    t = tile[pair]
    held = np.bincount(pair, weights=below(t, hi[which]) - below(t, lo[which]), minlength=len(pairs))
    return (sent - np.bincount(tile, weights=held * readers_on, minlength=num_tiles),
            np.bincount(tile, weights=(size[group] - held) * readers_on, minlength=num_tiles))


def _rows_pieces(mapping, rows: Rows):
    """Per group of the rows and tile run it meets: (the group, the run,
    the elements of the group's rows within the run), counted from the
    rows' pattern, not row by row. None when the groups meet more runs
    than they have rows."""
    count = rows.count
    end = rows.base + (count - 1) * rows.stride + rows.width
    first = np.searchsorted(mapping.stops, rows.base, side="right")
    last = np.searchsorted(mapping.starts, end, side="left")
    met = np.maximum(last - first, 0)
    if met.sum() > count.sum():
        return None
    run, g = spans(first, first + met), range_index(first, first + met)
    base, stride, width, count = rows.base[g], rows.stride[g], rows.width[g], count[g]

    def below(x):
        """Elements of group g's rows before position x."""
        offset = x - base
        row = offset // stride
        whole = np.clip(row, 0, count) * width
        return whole + np.where((row >= 0) & (row < count), np.clip(offset - row * stride, 0, width), 0)
    return g, run, below(np.minimum(mapping.stops[run], end[g])) - below(np.maximum(mapping.starts[run], rows.base[g]))


def _shared_rows_exchange(num_tiles: int, mapping, shared: SharedRows, tiles: np.ndarray):
    """_read_exchange of regions shared by vertices, given as Rows (see
    SharedRows): pieces per group of rows and tile run, not per interval.
    None when the groups meet more runs than they have rows."""
    rows = shared.rows
    pieces = _rows_pieces(mapping, rows)
    if pieces is None:
        return None
    g, run, lengths = pieces
    count = max(int(rows.vertex.max()) + 1 if len(rows.vertex) else 0,
                int(shared.region.max()) + 1 if len(shared.region) else 0)
    size = np.bincount(rows.vertex, weights=rows.count * rows.width, minlength=count)
    return _grouped_exchange(num_tiles, rows.vertex[g], mapping.tiles[run], lengths, size, tiles,
                             shared.region, count)


def _rows_exchange(num_tiles: int, mapping, rows: Rows, tiles: np.ndarray):
    """_read_exchange of a read whose vertices each read their own
    intervals, given as Rows: per group and tile run it meets, the
    elements of the group's rows within the run (counted from the rows'
    pattern, not row by row). None when the groups meet more runs than
    they have rows (then per interval)."""
    pieces = _rows_pieces(mapping, rows)
    if pieces is None:
        return None
    g, run, lengths = pieces
    owners, reader = mapping.tiles[run], tiles[rows.vertex]
    local = reader[g] == owners
    kept = np.bincount(owners[local], weights=lengths[local], minlength=num_tiles)
    return (np.bincount(owners, weights=lengths, minlength=num_tiles) - kept,
            np.bincount(reader, weights=rows.count * rows.width, minlength=num_tiles) - kept)


def _below(mapping, scale: int = 1):
    """below(tiles, x) -> the elements each tile of `tiles` holds before
    position x (arrays; positions scaled by `scale`: run [start, stop) as
    [start * scale, stop * scale)): the runs sorted by tile, a tile's
    elements before each run summed, one search per query."""
    order = np.lexsort((mapping.starts, mapping.tiles))
    tiles = mapping.tiles[order].astype(np.int64)
    starts = mapping.starts[order].astype(np.int64) * scale
    lengths = mapping.stops[order].astype(np.int64) * scale - starts
    span = mapping.size * scale + 1
    keys = tiles * span + starts
    before = np.cumsum(lengths) - lengths
    if len(tiles):     # each tile's own: less what the earlier tiles hold
        first = np.r_[0, np.flatnonzero(tiles[1:] != tiles[:-1]) + 1]
        before -= np.repeat(before[first], np.diff(np.r_[first, len(tiles)]))

    def below(t: np.ndarray, x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(keys, t * span + x, side="right") - 1
        j = np.maximum(i, 0)
        mine = (i >= 0) & (tiles[j] == t)
        return np.where(mine, before[j] + np.clip(x - starts[j], 0, lengths[j]), 0)
    return below


def _kept_on_tile(a, b_tiles: np.ndarray, b_starts: np.ndarray, num_tiles: int) -> np.ndarray:
    """Elements each tile holds under both mapping `a` and the runs
    (b_tiles, b_starts; ascending starts from 0, each up to the next) of a
    second mapping of the same elements, usually far fewer: each run of
    `a` is given the run of b it starts in by a repeat (no search per run
    of a), and only the runs of `a` that cross into another run of b (at
    most one per run of b) are cut into pieces."""
    starts, stops, tiles = a.starts, a.stops, a.tiles
    if not len(starts):
        return np.zeros(num_tiles)
    b_stops = np.r_[b_starts[1:], a.size]
    # The runs of `a` starting in each run of b, then b's run of each.
    first = np.searchsorted(starts, b_starts, side="left")
    j = np.repeat(np.arange(len(b_starts)), np.diff(np.r_[first, len(starts)]))
    lengths = stops - starts
    cross = stops > b_stops[j]
    same = (tiles == b_tiles[j]) & ~cross
    kept = np.bincount(tiles[same], weights=lengths[same], minlength=num_tiles)
    crossing = np.flatnonzero(cross)
    if len(crossing):
        last = np.searchsorted(b_starts, stops[crossing], side="left")     # past b's run of the last element
        piece = spans(j[crossing], last)
        run = crossing[range_index(j[crossing], last)]
        on = tiles[run] == b_tiles[piece]
        cut = np.minimum(stops[run], b_stops[piece]) - np.maximum(starts[run], b_starts[piece])
        kept = kept + np.bincount(tiles[run][on], weights=cut[on], minlength=num_tiles)
    return kept


def _once_exchange(num_tiles: int, mapping, once: ReadOnce, merge: bool | None = None):
    """_read_exchange of a read taking each element once (ReadOnce): an
    owner sends all it holds but what the reader on its own tile takes,
    a reader receives all it reads but that. None when the tensor is not
    whole copies of the reading mapping's elements (each `inner` long).
    merge: whether to cut the tensor's runs at the reading mapping's (by
    default when the tensor has as many runs as all copies of those)."""
    by, inner = once.mapping, once.inner
    period = by.size * inner
    if not period or mapping.size % period or by.starts[0] != 0:
        return None
    copies = mapping.size // period
    if merge if merge is not None else copies * len(by.starts) <= len(mapping.starts):
        starts = (np.arange(copies, dtype=np.int64)[:, None] * period + by.starts.astype(np.int64) * inner).ravel()
        kept = _kept_on_tile(mapping, np.tile(by.tiles, copies), starts, num_tiles)
    else:
        # Fewer runs than the reading mapping's copies have: per run of
        # the tensor, its elements the reading tile's copies hold, counted
        # within each copy by the reading mapping's runs on that tile.
        below = _below(by, inner)
        tiles = mapping.tiles.astype(np.int64)
        lo, hi = mapping.starts.astype(np.int64), mapping.stops.astype(np.int64)
        c0, c1 = lo // period, (hi - 1) // period
        whole = by.elements_per_tile(num_tiles)[tiles] * inner
        ends = np.where(c0 == c1, hi - c0 * period, period)
        within = below(tiles, ends) - below(tiles, lo - c0 * period)
        across = (c1 - c0 - 1).clip(0) * whole + np.where(c0 == c1, 0, below(tiles, hi - c1 * period))
        kept = np.bincount(tiles, weights=within + across, minlength=num_tiles)
    return (mapping.elements_per_tile(num_tiles) - kept,
            by.elements_per_tile(num_tiles) * (copies * inner) - kept)


def _once_exchange_memo(num_tiles: int, mapping, once: ReadOnce, memo: dict):
    """_once_exchange, once per tensor mapping and reading mapping (the
    same tensor read by several compute sets, or tensors sharing a
    mapping, over other vertex arrays of one mapping)."""
    key = ("once", id(mapping), id(once.mapping), once.inner)
    if key not in memo:
        # The mappings are kept with the result, so their ids stay theirs.
        memo[key] = (mapping, once.mapping), _once_exchange(num_tiles, mapping, once)
    return memo[key][1]


def _region_exchanges(num_tiles: int, vertices, tiles: np.ndarray, memo: dict):
    """(tensor, elements sent, elements received) per read region. A region
    whose mapping, intervals, offsets and vertex tiles were counted before
    (the same vertex pattern over other tensors of the same mapping: the
    same product in each layer of a model) is not counted again."""
    if not isinstance(vertices, VertexArray):
        for tensor, intervals, of, readers, groups in region_groups(vertices, "reads"):
            yield tensor, *_read_exchange(num_tiles, tensor.mapping, intervals, of, tiles[readers], groups)
        return
    for region, rows in zip(vertices.reads, vertices.read_rows, strict=True):
        tensor, intervals, offsets = region
        key = (id(tensor.mapping), id(intervals), id(offsets), id(tiles))
        if key not in memo:
            if isinstance(rows, ReadOnce):
                counted = _once_exchange_memo(num_tiles, tensor.mapping, rows, memo)
            elif isinstance(rows, SharedRows):
                counted = _shared_rows_exchange(num_tiles, tensor.mapping, rows, tiles)
            else:
                counted = None if rows is None else _rows_exchange(num_tiles, tensor.mapping, rows, tiles)
            if counted is None:
                _, grouped, of, readers, groups = vertices.grouped(region)
                counted = _read_exchange(num_tiles, tensor.mapping, grouped, of, tiles[readers], groups)
            # The objects are kept with the result, so their ids stay theirs.
            memo[key] = (tensor.mapping, intervals, offsets, tiles), counted
        yield tensor, *memo[key][1]


def _held_bytes(target: Target, tensors) -> np.ndarray:
    """Bytes of these tensors each tile holds: the most a tile sends in one
    exchange, as the exchange multicasts (a tile sends an element once and
    every tile that needs it receives it in the same cycles), so a
    broadcast or a gather reading an element many times sends it once."""
    held = np.zeros(target.num_tiles, dtype=np.int64)
    for t in set(tensors):
        held += t.mapping.elements_per_tile(target.num_tiles) * t.dtype.itemsize
    return held


def cost_execute(target: Target, step: Execute, memo: dict | None = None) -> np.ndarray:
    """Fills step.cycles / exchange_bytes; returns the bytes of exchange
    buffers per tile (what each tile receives, or a data-dependent
    exchange's planned buffers). memo: the exchange of read regions
    already counted, by their mapping and arrays (see cost_steps)."""
    vertices = step.compute_set.vertices
    tiles = vertex_tiles(vertices)
    compute = np.bincount(tiles, weights=vertex_cycles(vertices), minlength=target.num_tiles) \
        if len(vertices) else np.zeros(target.num_tiles)
    plan = step.compute_set.exchange
    if plan is not None:   # each round: exchange, then sync (vertex cycles include every round)
        step.exchange_bytes = int(plan.received.sum())
        busiest = max(int(plan.sent.max(initial=0)), int(plan.received.max(initial=0)))
        step.exchange_cycles = plan.rounds * target.exchange_fixed_cycles + -(-busiest // target.exchange_bytes_per_cycle)
        step.sync_cycles = plan.rounds * target.sync_cycles
        step.cycles = int(step.exchange_cycles + compute.max(initial=0) + step.sync_cycles)
        return plan.buffers
    tensors = set()
    sent = np.zeros(target.num_tiles)
    received = np.zeros(target.num_tiles)
    for tensor, s, r in _region_exchanges(target.num_tiles, vertices, tiles, {} if memo is None else memo):
        sent += s * tensor.dtype.itemsize
        received += r * tensor.dtype.itemsize
        tensors.add(tensor)
    sent, received = np.rint(sent).astype(np.int64), np.rint(received).astype(np.int64)
    if tensors:
        sent = np.minimum(sent, _held_bytes(target, tensors))
    step.exchange_bytes = int(received.sum())
    step.exchange_cycles = int(exchange_cycles(target, sent, received))
    step.sync_cycles = target.sync_cycles
    step.cycles = int(step.exchange_cycles + compute.max(initial=0) + step.sync_cycles)
    return received


# Elements a Copy's exchange is counted over at a time (see cost_copy).
COPY_CHUNK = 1 << 16


def _bincount_chunked(values: np.ndarray, tiles: int) -> np.ndarray:
    """np.bincount in chunks that stay in cache (bincount widens its input
    to intp): whole-array passes cost most of a large program's costing."""
    counts = np.zeros(tiles, np.int64)
    for start in range(0, values.size, COPY_CHUNK):
        counts += np.bincount(values[start:start + COPY_CHUNK], minlength=tiles)
    return counts


def cost_copy(target: Target, step: Copy) -> np.ndarray:
    # The per-element tiles made here are dropped afterwards: kept for
    # every copied tensor, they took gigabytes of a large program's compile.
    mappings = [t.mapping for t in (step.dst, *step.src.tensors) if not t.mapping.holds_element_tiles]
    try:
        return _cost_copy(target, step)
    finally:
        for m in mappings:
            m.drop_element_tiles()


def _kept_in_order(dst, parts: tuple, axis: int, tiles: int) -> np.ndarray | None:
    """Elements each tile keeps in a copy of whole tensors read in their
    own order (a concatenation, or one tensor reshaped), from the runs of
    the mappings: a part's chunk along the concatenated axis lands
    contiguous in the destination, so its runs, cut at chunk ends, are
    intervals of the destination split by owner. None when the chunks are
    too short for that to pay (per element then)."""
    if len(parts) == 1:      # one tensor in its own order: element i lands at i
        m = parts[0].tensor.mapping
        if not len(m.tiles):
            return np.zeros(tiles, np.int64)
        return _kept_on_tile(m, dst.mapping.tiles, dst.mapping.starts, tiles).astype(np.int64)
    runs = sum(len(part.tensor.mapping.tiles) for part in parts)
    inner = [int(np.prod(part.shape[axis:], dtype=np.int64)) for part in parts]
    if runs + sum(part.size // max(c, 1) for part, c in zip(parts, inner, strict=True)) > dst.size // 8:
        return None
    row = int(np.prod(dst.shape[axis:], dtype=np.int64))
    kept = np.zeros(tiles, np.int64)
    offset = 0
    for part, chunk in zip(parts, inner, strict=True):
        m = part.tensor.mapping
        if chunk == 0 or not len(m.tiles):
            continue
        first, last = m.starts.astype(np.int64) // chunk, (m.stops.astype(np.int64) - 1) // chunk
        piece = spans(first, last + 1)                    # chunk of each piece
        run = range_index(first, last + 1)
        lo = np.maximum(m.starts[run], piece * chunk)
        hi = np.minimum(m.stops[run], (piece + 1) * chunk)
        at = piece * row + offset - piece * chunk         # destination of part position 0 of the chunk
        index, owners, lengths = _owners(dst.mapping, np.stack([lo + at, hi + at], axis=1), ascending=True)
        holder = m.tiles[run] if index is None else m.tiles[run][index]
        same = holder == owners
        kept += np.bincount(owners[same], weights=lengths[same], minlength=tiles).astype(np.int64)
        offset += chunk
    return kept


def _kept_permuted(dst, src, parts: tuple, tiles: int) -> np.ndarray:
    """Elements each tile keeps in a copy reading each element of its
    tensors once through reshapes and transposes: the parts are compared
    with the destination where they land, not concatenated."""
    at = dst.mapping.element_tiles().reshape(src.shape)
    kept = np.zeros(tiles, np.int64)
    offset = 0
    for part in parts:
        r = at
        if isinstance(src, Concat):
            r = at[(slice(None),) * src.axis + (slice(offset, offset + part.shape[src.axis]),)]
            offset += part.shape[src.axis]
        o = part.apply(lambda t: t.mapping.element_tiles())
        kept += _bincount_chunked(r[o == r], tiles)
    return kept


# Consecutive elements a Copy's view reads contiguously from its tensor (a
# segment) below which _copy_segments leaves the view to be counted per element.
MIN_SEGMENT = 4
# Atoms (the largest first) _copy_segments tries.
SEGMENT_TRIES = 16


def _atom_ops(shape: tuple, ops: tuple, atom: int) -> tuple | None:
    """The view ops `ops` of a tensor of `shape` restated over the tensor's
    blocks of `atom` consecutive elements along its last axis (an atom),
    when every op keeps each atom whole, in order and aligned along one
    axis: then the view's elements along that axis, `atom` at a time from
    the first, are one atom or all padding, and the restated ops on an
    array of each atom's first element give those. (ops, the gcd of the
    sizes the atom had to divide, the view's elements after the atom's
    axis: the view's stride along it.) None otherwise (an op splitting,
    strided over or reversing the atom's axis; a gather)."""
    if not shape or shape[-1] % atom:
        return None
    shape, axis, out = list(shape), len(shape) - 1, []
    sizes = [shape[-1]]    # what the atom must divide (see _copy_segments)

    def coarse(s, at):
        s = list(s)
        s[at] //= atom
        return tuple(s)
    for op in ops:
        kind = op[0]
        if kind == "reshape":
            new, inner = list(op[1]), int(np.prod(shape[axis + 1:], dtype=np.int64))
            fits = [j for j in range(len(new)) if int(np.prod(new[j + 1:], dtype=np.int64)) == inner
                    and new[j] % atom == 0]
            if not fits:
                return None
            at = max(fits, key=lambda j: new[j])    # (not a size-1 axis beside it)
            sizes.append(new[at])
            out.append(("reshape", coarse(new, at)))
            shape, axis = new, at
        elif kind == "transpose":
            perm = tuple(op[1])
            out.append(op)
            shape, axis = [shape[j] for j in perm], perm.index(axis)
        elif kind == "slice":
            starts, limits, strides = op[1:]
            if strides[axis] != 1 or starts[axis] % atom or limits[axis] % atom:
                return None
            sizes.extend((starts[axis], limits[axis]))
            s0, l0 = list(starts), list(limits)
            s0[axis], l0[axis] = starts[axis] // atom, limits[axis] // atom
            out.append(("slice", tuple(s0), tuple(l0), tuple(strides)))
            shape = [len(range(a, b, c)) for a, b, c in zip(starts, limits, strides, strict=True)]
        elif kind == "broadcast":
            new, dims = op[1], tuple(op[2])
            at = dims[axis]
            if new[at] != shape[axis]:
                return None
            out.append(("broadcast", coarse(new, at), dims))
            shape, axis = list(new), at
        elif kind == "windows":
            spec, fill = op[1], op[2]
            lead = len(shape) - len(spec)
            moved = axis
            if axis >= lead:
                i = axis - lead
                window, stride, lo, hi, base, dilation, reverse = spec[i]
                if base != 1 or reverse or lo % atom or hi % atom:
                    return None
                if window == 1 and stride == 1:          # the atom stays on the output axis
                    coarse_spec = (1, 1, lo // atom, hi // atom, 1, 1, 0)
                    sizes.extend((lo, hi))
                elif window % atom == 0 and dilation == 1:    # it moves to the window axis
                    single = shape[axis] + lo + hi == window      # (one window: any stride)
                    if stride % atom and not single:
                        return None
                    coarse_spec = (window // atom, 1 if single else stride // atom, lo // atom, hi // atom, 1, 1, 0)
                    moved = len(shape) + i
                    sizes.extend((lo, hi, window, 0 if single else stride))
                else:
                    return None
                spec = tuple(sp if j != i else coarse_spec for j, sp in enumerate(spec))
            out.append(("windows", spec, fill))
            shape, axis = [*shape[:lead], *window_outputs(shape[lead:], op[1]), *(w for w, *_ in op[1])], moved
        else:
            return None
    return tuple(out), math.gcd(*sizes), int(np.prod(shape[axis + 1:], dtype=np.int64))


def _copy_segments(view: View, dst) -> tuple[int, int, np.ndarray, np.ndarray] | None:
    """The view read as segments of `atom` elements, each contiguous in its
    tensor (or all padding) and `stride` apart in the view: (atom, stride,
    the tensor's flat element of each segment's first, -1 for padding,
    the view's flat element of each segment's first), for a copy into
    mapping `dst`. The atom is one _atom_ops can restate the view's ops
    over, at least MIN_SEGMENT, chosen for the least work: a segment each,
    and an element each of those crossing a run's end (_kept_by_segments).
    None when there is none, or it would be no less work than counting
    every element."""
    shape, src = view.tensor.shape, view.tensor.mapping
    if not view.tensor.size or not shape or not view.size:
        return None
    # With atom 1 every op keeps it; the sizes it passed bound the others.
    whole = _atom_ops(shape, view.ops, 1)
    if whole is None or whole[1] < MIN_SEGMENT:
        return None
    _, bound, stride = whole
    small = [d for d in range(1, math.isqrt(bound) + 1) if bound % d == 0]
    # Runs' ends the segments may cross: the destination's (each met by
    # `stride` segments interleaved there), and the source's as often as
    # the view reads each element.
    ends = len(dst.starts) * stride + len(src.starts) * -(-view.size // view.tensor.size)

    def work(d):
        return view.size / d + ends * d
    divisors = sorted((d for d in {*small, *(bound // d for d in small)}
                       if d >= MIN_SEGMENT and work(d) < view.size / 2), key=work)
    for atom in divisors[:SEGMENT_TRIES]:
        segments = _segments(view, atom)
        if segments is not None:
            return segments
    return None


def _segments(view: View, atom: int) -> tuple[int, int, np.ndarray, np.ndarray] | None:
    """_copy_segments with this atom, or None when _atom_ops cannot
    restate the view's ops over it."""
    shape = view.tensor.shape
    made = _atom_ops(shape, view.ops, atom)
    if made is None:
        return None
    ops, _, stride = made
    ops = tuple((*op[:-1], np.int64(-1)) if op[0] == "windows" else op for op in ops)
    first = np.arange(0, view.tensor.size, atom, dtype=np.int64).reshape(*shape[:-1], shape[-1] // atom)
    first = np.ascontiguousarray(apply_ops(first, ops)).ravel()
    at = np.arange(len(first), dtype=np.int64)
    return atom, stride, first, at // stride * (atom * stride) + at % stride


def _run_index(stops: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """np.searchsorted(stops, keys, side="right") for ascending keys, from
    how many keys precede each stop (a search per stop, not per key)."""
    before = np.searchsorted(keys, stops, side="left")
    return np.repeat(np.arange(len(stops) + 1), np.diff(np.r_[0, before, len(keys)]))


def _kept_by_segments(dst, src, atom: int, stride: int, first: np.ndarray, at: np.ndarray,
                      tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """A Copy's (elements each tile keeps, elements each tile's part of
    the source is read) from its view's segments (_copy_segments): of
    mappings `dst` and `src`, a segment within one run of each is counted
    whole, the few crossing a run's end element by element. Padding is
    charged as a read of the tensor's last element (as source_tiles does)."""
    pad = first < 0
    last_tile = src.tiles[-1]
    # Per atom of the source (segments start at atoms): its tile, and
    # whether it lies in one run; per segment its destination run (the
    # segments' first elements ascend: no search per segment).
    atoms = np.arange(0, src.size, atom, dtype=np.int64)
    a_run = _run_index(src.stops, atoms)
    k = np.where(pad, 0, first // atom)
    s_tile = np.where(pad, last_tile, src.tiles[a_run][k])
    d_run = _run_index(dst.stops, at)
    whole = (pad | (src.stops[a_run] >= atoms + atom)[k]) & (dst.stops[d_run] > at + (atom - 1) * stride)
    d_tile = dst.tiles[d_run]
    w = np.flatnonzero(whole)
    read = np.bincount(s_tile[w], minlength=tiles).astype(np.int64) * atom
    same = w[s_tile[w] == d_tile[w]]
    local = np.bincount(d_tile[same], minlength=tiles).astype(np.int64) * atom
    cut = np.flatnonzero(~whole)
    if len(cut):     # element by element
        j = np.arange(atom, dtype=np.int64)
        s = (first[cut, None] + j).ravel()
        e = (at[cut, None] + j * stride).ravel()
        o = np.where(np.repeat(pad[cut], atom), last_tile,
                     src.tiles[np.minimum(np.searchsorted(src.stops, np.maximum(s, 0), side="right"),
                                          len(src.tiles) - 1)])
        r = dst.tiles[np.searchsorted(dst.stops, e, side="right")]
        read += np.bincount(o, minlength=tiles)
        local += np.bincount(r[o == r], minlength=tiles)
    return local, read


def _cost_copy(target: Target, step: Copy) -> np.ndarray:
    itemsize = step.dst.dtype.itemsize
    tiles = target.num_tiles
    # What each tile holds less what stays on it is sent; what it reads
    # less that is received.
    parts = step.src.parts if isinstance(step.src, Concat) else (step.src,)
    once = len({p.tensor.id for p in parts}) == len(parts)   # each element of the tensors read once
    local = None
    if once and all(p.is_whole_tensor for p in parts):
        local = _kept_in_order(step.dst, parts, step.src.axis if isinstance(step.src, Concat) else 0, tiles)
    if local is None and once and all(op[0] in ("reshape", "transpose") for p in parts for op in p.ops):
        local = _kept_permuted(step.dst, step.src, parts, tiles)
    if local is not None:
        read = sum(part.tensor.mapping.elements_per_tile(tiles) for part in parts)
    elif isinstance(step.src, View) and (segments := _copy_segments(step.src, step.dst.mapping)) is not None:
        local, read = _kept_by_segments(step.dst.mapping, step.src.tensor.mapping, *segments, tiles)
    else:
        readers = step.dst.mapping.element_tiles()
        owners = source_tiles(step.src)
        local, read = np.zeros(tiles, np.int64), np.zeros(tiles, np.int64)
        for start in range(0, owners.size, COPY_CHUNK):
            o, r = owners[start:start + COPY_CHUNK], readers[start:start + COPY_CHUNK]
            read += np.bincount(o, minlength=tiles)
            local += np.bincount(r[o == r], minlength=tiles)
    local *= itemsize
    sent = read * itemsize - local
    sent = np.minimum(sent, _held_bytes(target, step.src.tensors))
    received = step.dst.mapping.elements_per_tile(target.num_tiles) * itemsize - local
    # Elements staying on their tile still move through the tile's memory.
    on_tile = -(-local.max(initial=0) // target.sram_write_bytes_per_cycle)
    step.exchange_bytes = int(received.sum())
    step.exchange_cycles = int(exchange_cycles(target, sent, received) + on_tile)
    step.sync_cycles = target.sync_cycles
    step.cycles = step.exchange_cycles + step.sync_cycles
    return received


def host_call_cycles(target: Target, host_bytes: int) -> int:
    """Both streams at the host-link rate, with a sync on either side."""
    seconds = host_bytes / target.host_link_bytes_per_second
    return int(seconds * target.clock_hz) + 2 * target.sync_cycles


# A predicate or branch index, as exchanged: one 32-bit word.
PREDICATE_BYTES = 4


def cost_control(target: Target, step) -> None:
    """A control step's own cycles per decision. A Repeat's counter lives
    on every tile: its test and branch. A RepeatWhileTrue, If or Switch
    decides on a predicate one tile computed, which every tile needs to
    take the same branch: a sync (the predicate is ready), its broadcast
    (an exchange of one word from one tile to all the others), then the
    branch."""
    if isinstance(step, p.Repeat):
        step.cycles, step.exchange_bytes, step.exchange_cycles, step.sync_cycles = target.branch_cycles, 0, 0, 0
        return
    if isinstance(step, (p.RepeatWhileTrue, p.If, p.Switch)):
        word = np.full(1, PREDICATE_BYTES)
        step.exchange_bytes = PREDICATE_BYTES * (target.num_tiles - 1)
        step.exchange_cycles = int(exchange_cycles(target, word, word)) if target.num_tiles > 1 else 0
        step.sync_cycles = target.sync_cycles
        step.cycles = step.exchange_cycles + step.sync_cycles + target.branch_cycles


def cost_steps(target: Target, steps: list, memo: dict | None = None) -> list[np.ndarray]:
    """Costs every Execute and Copy; per step, bytes received per tile (the
    exchange buffers the memory plan counts while the step runs). Read
    regions of the same mapping and vertex arrays are counted once (see
    Builder.pattern)."""
    memo = {} if memo is None else memo
    none = np.zeros(target.num_tiles, dtype=np.int64)
    out = []
    for step in steps:
        if isinstance(step, Execute):
            out.append(cost_execute(target, step, memo))
        elif isinstance(step, Copy):
            out.append(cost_copy(target, step))
        elif isinstance(step, HostCall):
            step.cycles = host_call_cycles(target, step.host_bytes)
            out.append(none)
        elif isinstance(step, CONTROL):   # each sub-program step; the busiest buffers
            for control in _controls(step):
                cost_control(target, control)
            inner = cost_steps(target, list(leaves(step)), memo)
            out.append(np.max(inner, axis=0) if inner else none)
        else:
            out.append(none)
    return out


def _controls(step):
    """A control step and the control steps inside it."""
    if isinstance(step, CONTROL):
        yield step
        for child in p.children(step):
            yield from _controls(child)


def static_cycles(body) -> tuple[int, list[dict]]:
    """One run's cycles as known at compile time, host streams excluded:
    a Repeat counts its body and its control (cost_control) times its
    count, an If or Switch its decision and its longest branch. A
    RepeatWhileTrue's trip count is known only at run time: it counts its
    condition and one test of it (no iteration), and is listed as {name,
    cycles_per_iteration (body, condition and a test), entered (times a
    run enters it; None inside another such loop)}."""
    loops: list[dict] = []

    def walk(step, entered) -> int:
        if isinstance(step, p.Sequence):
            return sum(walk(s, entered) for s in step.steps)
        if isinstance(step, p.Call):
            return walk(step.function, entered)
        if isinstance(step, p.Repeat):
            return step.count * (step.cycles + walk(step.body, None if entered is None else entered * step.count))
        if isinstance(step, p.RepeatWhileTrue):
            condition = walk(step.condition, entered) + step.cycles
            record = {"name": step.name or step.predicate.name, "cycles_per_iteration": 0, "entered": entered}
            loops.append(record)
            record["cycles_per_iteration"] = condition + walk(step.body, None)
            return condition
        if isinstance(step, (p.If, p.Switch)):
            return step.cycles + max(walk(branch, entered) for branch in p.children(step))
        if isinstance(step, (p.HostToDevice, p.DeviceToHost)):
            return 0
        return int(getattr(step, "cycles", 0))
    return walk(body, 1), loops
