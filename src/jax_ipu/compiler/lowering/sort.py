"""sort and chlo.top_k: operands rearranged to [rows, n] with the sorted
dimension last (a Copy when that is a layout change), whole rows mapped to
tiles, one vertex per tile sorting its rows. A comparator that is LT or GT
of one key computed from one operand (JAX's total-order float compare, or
an integer compare) sorts by that key; any other comparator runs as a
stable merge sort evaluating the comparator body.

A row too long for one tile's memory sorts by a key across tiles: cut
into blocks on their own tiles, each block sorted (BlockSort), then
Batcher's odd-even merge network over the blocks, each stage a compute set
of merge-splits of block pairs (MergeSplit), ties broken by position so
the result is stable."""
from __future__ import annotations

import math

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder, Splat
from jax_ipu.compiler.lowering.indexing import region_program
from jax_ipu.compiler.lowering.layout import copy_to_new, name_of
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.errors import IpuOutOfMemoryError, IpuUnimplementedError
from jax_ipu.graph import codelets_indexing as ci
from jax_ipu.graph.compute import Region, Vertex
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.views import View

# Compare types under which LT / GT is a total order we can sort keys by.
_ORDERED = {"TOTALORDER", "SIGNED", "UNSIGNED"}


def _expression(program, n_args: int, register: int, arg: int):
    """A register's value as a tree over one argument (None when it reads
    another argument)."""
    if register < n_args:
        return "x" if register == arg else None
    ins = program[register - n_args]
    if ins.op == "constant":
        return ("constant", np.asarray(dict(ins.attrs)["value"]).tobytes(), ins.dtype.str)
    children = tuple(_expression(program, n_args, a, arg) for a in ins.args)
    if any(c is None for c in children):
        return None
    return (ins.op, ins.attrs, ins.dtype.str, children)


def key_comparator(program, result: int, n_args: int) -> tuple[int, bool] | None:
    """(register of the key for lhs, descending) when the comparator is
    `key(lhs_k) < key(rhs_k)` (or >) for one operand k under a total order."""
    if result < n_args:
        return None
    ins = program[result - n_args]
    attrs = dict(ins.attrs)
    if (ins.op != "compare" or attrs.get("comparison_direction") not in ("LT", "GT")
            or attrs.get("compare_type") not in _ORDERED):
        return None
    for k in range(0, n_args, 2):
        lhs = _expression(program, n_args, ins.args[0], k)
        if lhs is not None and lhs == _expression(program, n_args, ins.args[1], k + 1):
            return ins.args[0], attrs["comparison_direction"] == "GT"
    return None


def _key_dtype(op: ir.Op, program, register: int, n_args: int) -> np.dtype:
    if register < n_args:
        return np.dtype(op.operands[register // 2].type.dtype)
    return np.dtype(program[register - n_args].dtype)


def rows_mapping(b: Builder, rows: int, n: int) -> TileMapping:
    """Whole rows on each tile, spread linearly."""
    per_tile = max(1, -(-rows // b.target.num_tiles)) * n
    return TileMapping.linear(rows * n, b.target.num_tiles, grain=n, min_elements_per_tile=per_tile)


def as_rows(b: Builder, op: ir.Op, value: ir.Value, dim: int) -> View:
    """The operand as a whole [rows, n] tensor, `dim` last."""
    shape = value.type.shape
    x = b.view(value, name_of(op))
    rank = len(shape)
    if dim != rank - 1:
        x = x.then("transpose", tuple(d for d in range(rank) if d != dim) + (dim,))
    if not x.is_whole_tensor:
        x = copy_to_new(b, op, x)
    n = shape[dim] if rank else 1
    return x.then("reshape", (value.type.size // max(n, 1), n))


def from_rows(b: Builder, op: ir.Op, out, shape: tuple[int, ...], dim: int) -> View:
    """A [rows, n] result (a tensor or view) back in the op's dimension order."""
    rank = len(shape)
    moved = tuple(shape[d] for d in range(rank) if d != dim) + (shape[dim],)
    view = (out if isinstance(out, View) else View(out)).then("reshape", moved)
    if dim == rank - 1:
        return view.then("reshape", shape)
    perm = tuple(d for d in range(rank) if d != dim) + (dim,)
    return copy_to_new(b, op, view.then("transpose", tuple(int(i) for i in np.argsort(perm))))


def _row_vertices(b: Builder, codelet: str, inputs: list[View], outs: list, n: int, per_row) -> list:
    m = outs[0].mapping
    vertices = []
    for tile in m.tiles_used():
        intervals = m.intervals_on(tile)
        rows = int((intervals[:, 1] - intervals[:, 0]).sum()) // max(n, 1)
        reads = tuple(Region(x.tensor, intervals) for x in inputs)
        vertices.append(Vertex(codelet, int(tile), reads, tuple(Region(o, intervals) for o in outs),
                               int(per_row(rows))))
    return vertices


@register("sort")
def sort(b: Builder, op: ir.Op) -> None:
    dim = op.attrs.get("dimension", -1)
    shape = op.results[0].type.shape
    dim = dim % len(shape) if shape else 0
    if not shape or op.results[0].type.size == 0 or shape[dim] <= 1:
        for r, v in zip(op.results, op.operands, strict=True):
            b.values[r] = b.values[v]
        return
    comparator = op.regions[0]
    if len(comparator.results) != 1:
        raise IpuUnimplementedError.for_op(op, "a sort comparator returning several values",
                                           "The program is malformed; please report it")
    program, (result,) = region_program(b, op, comparator)
    n_args = len(comparator.args)
    key = key_comparator(program, result, n_args)
    n = shape[dim]
    rows = op.results[0].type.size // n
    inputs = [as_rows(b, op, v, dim) for v in op.operands]
    itemsize = sum(v.type.dtype.itemsize for v in op.operands)
    rows_per_tile = -(-rows // b.target.num_tiles)
    if (key is not None and _key_dtype(op, program, key[0], n_args).itemsize <= 4
            and 2 * rows_per_tile * n * itemsize > b.target.bytes_per_tile // 2):
        results = _block_sort(b, op, inputs, program, key, rows, n, itemsize)
        for r, out in zip(op.results, results, strict=True):
            b.values[r] = from_rows(b, op, out, r.type.shape, dim)
        return
    if 2 * n * itemsize > b.target.bytes_per_tile and not b.options.allow_out_of_memory:
        # A row, sorted and unsorted, is more than a tile holds.
        how = ("by several keys or a custom comparator" if key is None else
               "by a 64-bit key")
        raise IpuOutOfMemoryError(
            f"out of memory: {name_of(op)} sorts rows of {n} elements {how}, which keeps each row on one "
            f"tile ({2 * n * itemsize:,} bytes with its result; a tile of {b.target.describe()} has "
            f"{b.target.bytes_per_tile:,}). Sort by one key of at most 32 bits, which sorts across tiles "
            f"(e.g. jnp.argsort on a combined key such as k1 * (k2.max() + 1) + k2, or argsort by k2 then a "
            f"stable argsort by k1), or sort shorter rows")
    mapping = rows_mapping(b, rows, n)
    outs = [b.tensor(name_of(op), (rows, n), v.type.dtype, mapping) for v in op.operands]
    passes = max(1, math.ceil(math.log2(n)))
    # Key sort: n log n key compares; merge sort: a comparator per compare.
    per_compare = 1 if key is not None else len(program)
    cycles = (lambda r: b.target.supervisor_cycles + cost.worker_cycles(
        b.target, r * n * passes * (per_compare + len(inputs)), 1, 1))
    kind = "key" if key is not None else "merge"
    vertices = _row_vertices(b, f"Sort<{kind},{outs[0].dtype.name}>", inputs, outs, n, cycles)
    b.execute(f"sort {kind} {name_of(op)}", ci.Sort(tuple(inputs), program, result, key, tuple(outs)), vertices)
    for r, out in zip(op.results, outs, strict=True):
        b.values[r] = from_rows(b, op, out, r.type.shape, dim)


def _merge_pairs(blocks: int) -> list[list[tuple[int, int]]]:
    """Batcher's odd-even merge sort over `blocks` (a power of two) sorted
    blocks: the stages, each a list of disjoint (lo, hi) block pairs."""
    stages = []
    p = 1
    while p < blocks:
        k = p
        while k >= 1:
            stage = [(i + j, i + j + k)
                     for j in range(k % p, blocks - k, 2 * k)
                     for i in range(min(k, blocks - j - k))
                     if (i + j) // (2 * p) == (i + j + k) // (2 * p)]
            stages.append(stage)
            k //= 2
        p *= 2
    return stages


def _block_sort(b: Builder, op: ir.Op, inputs: list[View], program, key, rows: int, n: int,
                itemsize: int) -> list[View]:
    """Rows sorted by a key across tiles (see the module's docstring)."""
    target = b.target
    # A tile holds each of its blocks of every operand and the index twice
    # (the merge stages alternate between two sets of tensors) and, in a
    # stage, the partner block it receives: keep that within a third of it.
    most = max(1, target.bytes_per_tile // 3 // (3 * (itemsize + 4)))
    blocks = 1 << max(0, math.ceil(math.log2(-(-n // most))))
    block = -(-n // blocks)
    if rows * blocks * block >= 1 << 31 or blocks * block >= 1 << 29:
        raise IpuUnimplementedError.for_op(
            op, f"sorting {rows} rows of {n} elements is beyond what one program sorts",
            "Sort fewer or shorter rows per call")
    width = blocks * block
    mapping = TileMapping.linear(rows * width, target.num_tiles, grain=block, min_elements_per_tile=block)
    name = name_of(op)
    outs = [b.tensor(f"{name}/blocks", (rows, width), x.dtype, mapping) for x in inputs]
    index = b.tensor(f"{name}/index", (rows, width), np.int32, mapping)
    tensors = outs + [index]
    passes = max(1, math.ceil(math.log2(max(block, 2))))
    sort_cycles = cost.worker_cycles(target, block * passes * (1 + len(inputs) + 1), 1, 1)
    vertices = []
    for tile in mapping.tiles_used():
        intervals = mapping.intervals_on(tile)
        reads = []
        for start, stop in intervals:
            for first in range(int(start), int(stop), block):
                r, j = divmod(first // block, blocks)
                lo, hi = r * n + j * block, r * n + min(n, (j + 1) * block)
                if lo < hi:
                    reads.append((lo, hi))
        count = int((intervals[:, 1] - intervals[:, 0]).sum()) // block
        span = np.array(reads, dtype=np.int64).reshape(-1, 2)
        vertices.append(Vertex(f"BlockSort<{outs[0].dtype.name}>", int(tile),
                               tuple(Region(x.tensor, span) for x in inputs),
                               tuple(Region(t, intervals) for t in tensors),
                               int(target.supervisor_cycles + sort_cycles * count)))
    b.execute(f"sort blocks {name}", ci.BlockSort(tuple(inputs), program, key, blocks, block,
                                                  tuple(outs), index), vertices)
    # The stages alternate between two sets of tensors (a compute set may
    # not read what it writes); unpaired blocks are copied across.
    spare = [b.tensor(f"{name}/merged", (rows, width), t.dtype, mapping) for t in tensors]
    merge_cycles = cost.worker_cycles(target, 2 * block * (2 + len(tensors)), 1, 1)
    copy_cycles = cost.worker_cycles(target, block * len(tensors), 1, 1)

    def spans(ids: np.ndarray) -> np.ndarray:
        return np.stack([ids * block, (ids + 1) * block], axis=1)

    tile_blocks = {int(tile): np.concatenate([np.arange(start, stop, block) // block
                                              for start, stop in mapping.intervals_on(tile)])
                   for tile in mapping.tiles_used()}
    for number, stage in enumerate(_merge_pairs(blocks)):
        lo, hi = zip(*stage, strict=True)
        partner = np.full(blocks, -1, dtype=np.int64)
        partner[list(lo)], partner[list(hi)] = hi, lo
        vertices = []
        for tile, own in tile_blocks.items():
            other = partner[own % blocks]
            paired = other >= 0
            read = np.concatenate([own, (own - own % blocks + other)[paired]])
            vertices.append(Vertex(f"MergeSplit<{outs[0].dtype.name}>", tile,
                                   tuple(Region(t, spans(np.sort(read))) for t in tensors),
                                   tuple(Region(t, spans(own)) for t in spare),
                                   int(target.supervisor_cycles + merge_cycles * paired.sum()
                                       + copy_cycles * (~paired).sum())))
        b.execute(f"sort merge {number} {name}",
                  ci.MergeSplit(tuple(tensors), tuple(spare), program, key, n, block, lo, hi), vertices)
        tensors, spare = spare, tensors
    outs = tensors[:-1]
    if width == n:
        return [View(t) for t in outs]
    return [View(t).then("slice", (0, 0), (rows, n), (1, 1)) for t in outs]


@register("chlo.top_k")
def top_k(b: Builder, op: ir.Op) -> None:
    x_t = op.operands[0].type
    values_t, indices_t = (r.type for r in op.results)
    if indices_t.dtype != np.int32:
        raise IpuUnimplementedError.for_op(op, f"top_k indices of {indices_t} are not supported",
                                           "Use int32 indices")
    n, k = x_t.shape[-1], values_t.shape[-1]
    rows = x_t.size // max(n, 1)
    if values_t.size == 0:
        for r in op.results:
            b.values[r] = Splat(np.zeros((), r.type.dtype), r.type.shape)
        return
    x = as_rows(b, op, op.operands[0], len(x_t.shape) - 1)
    in_rows = rows_mapping(b, rows, n)
    if x.tensor.mapping is not in_rows:
        staged = b.tensor(f"{name_of(op)}/rows", (rows, n), x.dtype, in_rows)
        b.copy(x, staged)
        x = View(staged)
    out_mapping = rows_mapping(b, rows, k)
    values = b.tensor(f"{name_of(op)}/values", (rows, k), values_t.dtype, out_mapping)
    indices = b.tensor(f"{name_of(op)}/indices", (rows, k), np.int32, out_mapping)
    passes = max(1, math.ceil(math.log2(max(n, 2))))
    vertices = []
    for tile in out_mapping.tiles_used():
        intervals = out_mapping.intervals_on(tile)
        count = int((intervals[:, 1] - intervals[:, 0]).sum()) // max(k, 1)
        first_row = intervals[0, 0] // k
        reads = (Region(x.tensor, np.array([[first_row * n, (first_row + count) * n]])),)
        vertices.append(Vertex(f"TopK<{values_t.dtype.name}>", int(tile), reads,
                               (Region(values, intervals), Region(indices, intervals)),
                               b.target.supervisor_cycles + cost.worker_cycles(b.target, count * n * passes, 1, 1)))
    b.execute(f"top_k {name_of(op)}", ci.TopK(x, values, indices), vertices)
    b.values[op.results[0]] = View(values).then("reshape", values_t.shape)
    b.values[op.results[1]] = View(indices).then("reshape", indices_t.shape)
