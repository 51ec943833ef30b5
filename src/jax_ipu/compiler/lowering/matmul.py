"""dot_general: operands rearranged to [batch, M, K] x [batch, K, N] (a
Copy when that is a layout change), per-tile partial products over K-chunks
as the plan says (float32 partials for float inputs, float16 ones when
asked: partials_type; K padded with zeros when only uneven chunks fit),
then a cross-tile reduction of the partials in a fixed order."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder, Splat
from jax_ipu.compiler.lowering.elementwise import lower_cluster
from jax_ipu.compiler.lowering.layout import copy_padded, copy_to_new, name_of
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.compiler.passes.fuse import Cluster
from jax_ipu.compiler.planners.matmul import fits, plan_matmul
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets
from jax_ipu.graph.compute import ReadOnce, VertexArray, compact
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import Concat, View


def partials_type(options, in_dtype: np.dtype, out_dtype: np.dtype) -> np.dtype:
    """The type of the partial sums of a matmul or convolution of
    `in_dtype` operands into `out_dtype`: Poplar's partialsType, float32 by
    default for float inputs; float16 when asked (partials_type="half") and
    the output is float16 (partials are never narrower than the output, as
    PopLibs ignores a narrower request); the output's own type for
    integers."""
    in_dtype, out_dtype = np.dtype(in_dtype), np.dtype(out_dtype)
    if out_dtype.kind != "f":
        return out_dtype
    if options.partials_type == "half" and in_dtype.itemsize == 2 and out_dtype.itemsize == 2:
        return np.dtype(np.float16)
    return np.dtype(np.float32)


def _canonical(b: Builder, op: ir.Op, value: ir.Value, order: list[int], shape3) -> View:
    """The operand as a whole-tensor view of shape3, its dims in `order`."""
    x = b.view(value, name_of(op))
    if order != sorted(order):
        x = copy_to_new(b, op, x.then("transpose", tuple(order)))
    return x.then("reshape", shape3)


@register("dot_general")
def dot_general(b: Builder, op: ir.Op) -> None:
    dims = op.attrs["dot_dimension_numbers"]
    lhs_t, rhs_t, out_t = op.operands[0].type, op.operands[1].type, op.results[0].type
    if out_t.dtype == np.bool_ or lhs_t.dtype != rhs_t.dtype:
        raise IpuUnimplementedError.for_op(
            op, f"dot_general of {lhs_t} and {rhs_t} to {out_t} is not supported",
            "Use numeric operands of one type, or file an issue")
    lb, lc = list(dims.lhs_batching_dimensions), list(dims.lhs_contracting_dimensions)
    rb, rc = list(dims.rhs_batching_dimensions), list(dims.rhs_contracting_dimensions)
    lf = [d for d in range(len(lhs_t.shape)) if d not in lb + lc]
    rf = [d for d in range(len(rhs_t.shape)) if d not in rb + rc]

    def prod(shape, ds):
        return int(np.prod([shape[d] for d in ds], dtype=np.int64))
    batch, m, k, n = prod(lhs_t.shape, lb), prod(lhs_t.shape, lf), prod(lhs_t.shape, lc), prod(rhs_t.shape, rf)
    out_dtype = out_t.dtype
    acc = partials_type(b.options, lhs_t.dtype, out_dtype)
    if batch * m * n == 0 or k == 0:
        b.values[op.results[0]] = Splat(np.zeros((), out_dtype), out_t.shape)
        return
    lhs = _canonical(b, op, op.operands[0], lb + lf + lc, (batch, m, k))
    rhs = _canonical(b, op, op.operands[1], rb + rc + rf, (batch, k, n))
    if k == 1:
        _outer_product(b, op, lhs, rhs, out_dtype)
        return
    proportion = b.options.available_memory_proportion
    plan = plan_matmul(b.target, batch, m, n, k, lhs_t.dtype, acc, proportion)
    steps = [(0, m, 0, n, plan)]
    if not fits(plan, b.target, proportion):
        serial = _serial_steps(b.target, batch, m, n, k, lhs_t.dtype, acc, proportion)
        if serial is not None and max(p.temporary_bytes for *_, p in serial) < plan.temporary_bytes:
            steps = serial
    b.flops += 2.0 * batch * m * n * k
    padded = max(p.blocks[3] * p.splits[3] for *_, p in steps)
    if padded != k:         # K padded with zeros to whole chunks (see plan_matmul)
        zero = np.zeros((), lhs.dtype)
        lhs, rhs = copy_padded(b, op, lhs, 2, padded - k, zero), copy_padded(b, op, rhs, 1, padded - k, zero)
    results = [_product(b, op, lhs, rhs, window, acc, out_dtype) for window in steps]
    if len(results) == 1:
        b.values[op.results[0]] = results[0].then("reshape", out_t.shape)
        return
    whole = copy_to_new(b, op, Concat(tuple(results), 1 if steps[0][1] - steps[0][0] < m else 2))
    b.values[op.results[0]] = whole.then("reshape", out_t.shape)


def _outer_product(b: Builder, op: ir.Op, lhs: View, rhs: View, out_dtype) -> None:
    """A product over K = 1 as one element-wise multiply of the broadcast
    operands (in the result's type), as XLA's algebraic simplifier rewrites
    it: each element is one product, so -0.0 * 1 keeps its sign (a sum from
    a zeroed accumulator would give +0.0) and the bits equal XLA:CPU's."""
    batch, m, _ = lhs.shape
    n = rhs.shape[2]
    shape = (batch, m, n)
    ops, operands = [], []
    for view in (lhs, rhs):
        value = ir.Value(ir.TensorType(shape, view.dtype))
        b.values[value] = view.then("broadcast", shape, (0, 1, 2))
        if view.dtype != out_dtype:
            convert = ir.Op("convert", [value], [ir.Value(ir.TensorType(shape, out_dtype))], {}, loc=op.loc)
            ops.append(convert)
            value = convert.results[0]
        operands.append(value)
    multiply = ir.Op("multiply", operands, [ir.Value(ir.TensorType(shape, out_dtype))], {}, loc=op.loc)
    ops.append(multiply)
    lower_cluster(b, Cluster(shape, ops), {multiply.results[0]})
    b.flops += 2.0 * batch * m * n
    result = b.values[multiply.results[0]]
    b.values[op.results[0]] = (Splat(result.value, op.results[0].type.shape) if isinstance(result, Splat)
                               else result.then("reshape", op.results[0].type.shape))


# At most this many products in turn for one dot_general (see _serial_steps).
MAX_SERIAL_STEPS = 256


def _serial_steps(target, batch: int, m: int, n: int, k: int, in_dtype, acc, proportion: float) -> list | None:
    """When no plan of the whole product fits the tiles, its rows (or
    columns, whichever are more) in blocks computed one after the other,
    each planned on all tiles, as PopLibs splits a product serially: the
    fewest blocks (a power of two) whose plan fits. [(r0, r1, c0, c1,
    plan)]; when no count up to MAX_SERIAL_STEPS fits, the blocks with the
    lowest peak (the best chance to fit the tiles at all: a tiny
    available_memory_proportion asks for it); None for a single row or
    column."""
    by_columns = n >= m
    extent = n if by_columns else m
    count = 2
    lowest = None     # (peak temporary bytes, steps) of the counts tried
    while count <= min(extent, MAX_SERIAL_STEPS):
        size = -(-extent // count)
        windows = [(lo, min(lo + size, extent)) for lo in range(0, extent, size)]
        plans = {}
        for lo, hi in windows:
            if hi - lo not in plans:
                plans[hi - lo] = plan_matmul(target, batch, m if by_columns else hi - lo, hi - lo if by_columns else n,
                                             k, in_dtype, acc, proportion)
        steps = [(0, m, lo, hi, plans[hi - lo]) if by_columns else (lo, hi, 0, n, plans[hi - lo])
                 for lo, hi in windows]
        if all(fits(p, target, proportion) for p in plans.values()):
            return steps
        peak = max(p.temporary_bytes for p in plans.values())
        if lowest is None or peak < lowest[0]:
            lowest = (peak, steps)
        count *= 2
    return lowest[1] if lowest else None


def _product(b: Builder, op: ir.Op, lhs: View, rhs: View, window: tuple, acc, out_dtype) -> View:
    """Rows r0:r1 and columns c0:c1 of the product of lhs [batch, M, Kp] and
    rhs [batch, Kp, N] (Kp: K, with zeros after it if padded) as its plan
    says: [batch, rows, columns]."""
    r0, r1, c0, c1, plan = window
    batch, m, kp = lhs.shape
    n = rhs.shape[2]
    rows, cols = r1 - r0, c1 - c0
    pb, pm, pn, pk = plan.splits
    bb, mb, nb, kc = plan.blocks
    if (r0, r1, kc * pk) != (0, m, kp):
        lhs = lhs.then("slice", (0, r0, 0), (batch, r1, kc * pk), (1, 1, 1))
    if (c0, c1, kc * pk) != (0, n, kp):
        rhs = rhs.then("slice", (0, 0, c0), (batch, kc * pk, c1), (1, 1, 1))

    codelet = f"MatMulPartial<{lhs.dtype.name},{acc.name}>"
    # A plan on few tiles starts where the last small one ended (as small
    # tensors do), not at tile 0 with every other small product.
    start = b.shared_start_tile(("matmul", batch, rows, cols, kp, plan), plan.tiles)
    mapping, tiles, cycles, lhs_iv, lhs_at, rhs_iv, rhs_at, out_iv, offsets = b.pattern(
        ("matmul", codelet, batch, m, n, kp, window, start),
        lambda: _partial_pattern(b, lhs.dtype, acc, window, batch, m, n, kp, start))
    partials = b.tensor(f"{name_of(op)}/partials", (pk, batch, rows, cols), acc, mapping)
    vertices = VertexArray(codelet, tiles, cycles, ((lhs.tensor, lhs_iv, lhs_at), (rhs.tensor, rhs_iv, rhs_at)),
                           ((partials, out_iv, offsets),))
    b.execute(f"matmul {name_of(op)} {pb}x{pm}x{pn}x{pk} tiles", codelets.MatMulPartials(lhs, rhs, partials),
              vertices)
    if pk == 1 and acc == out_dtype:
        return View(partials).then("reshape", (batch, rows, cols))
    out = b.tensor(name_of(op), (batch * rows * cols,), out_dtype)
    _reduce_partials(b, op, View(partials).then("reshape", (pk, batch * rows * cols)), out)
    return View(out).then("reshape", (batch, rows, cols))


def _grouped(keys: np.ndarray, even: bool, blocks: tuple, perm: tuple) -> np.ndarray:
    """The stable order that sorts `keys`: when the blocks divide evenly, the
    index array reshaped to `blocks` and transposed by `perm` (no sort)."""
    if even:
        return np.arange(len(keys)).reshape(blocks).transpose(perm).ravel()
    return np.argsort(keys, kind="stable")


def _partial_pattern(b: Builder, in_dtype: np.dtype, acc: np.dtype, window: tuple, batch: int, m: int, n: int,
                     kp: int, start: int) -> tuple:
    """The partials' mapping, and the partial products' vertices as arrays
    (tiles, cycles, lhs intervals and ranges, rhs intervals and ranges,
    partials intervals and offsets): vertex (kk, bi, mi, ni) (K-chunk,
    batch, row and column block, in that order) on the tile of its block,
    reading its rows of lhs' K-chunk and the K-chunk's rows of rhs' column
    block, writing its block of partials [pk, batch, rows, cols]."""
    r0, r1, c0, c1, plan = window
    rows, cols = r1 - r0, c1 - c0
    pb, pm, pn, pk = plan.splits
    bb, mb, nb, kc = plan.blocks
    nbb, nmb, nnb = -(-batch // bb), -(-rows // mb), -(-cols // nb)
    # Partials [pk, batch, rows, cols]: tile of block (kk, bi, mi, ni).
    # (From runs of a block row each: per element, this took seconds of a
    # convolutional network's compile.)
    col_blocks = np.arange(nnb)
    tile_of = (((np.arange(pk)[:, None, None, None] * pb + np.arange(batch)[None, :, None, None] // bb) * pm
                + np.arange(rows)[None, None, :, None] // mb) * pn + col_blocks)    # [pk, batch, rows, col blocks]
    tile_of = (tile_of + start) % b.target.num_tiles
    run_starts = np.arange(pk * batch * rows)[:, None] * cols + col_blocks * nb
    mapping = TileMapping.from_runs(pk * batch * rows * cols, tile_of, run_starts)
    widths = np.minimum(nb, cols - np.arange(nnb) * nb)                      # [nnb]
    vertices = pk * nbb * nmb * nnb
    v = np.arange(vertices)
    # lhs: a row of the K-chunk per (batch, row) of the block, shared by the
    # block's nnb column-block vertices: group (kk, batch block, row block).
    kk, bs, rs = np.ix_(np.arange(pk), np.arange(batch), np.arange(rows))
    group = ((kk * nbb + bs // bb) * nmb + rs // mb).ravel()
    even = batch % bb == 0 and rows % mb == 0
    order = _grouped(group, even, (pk, nbb, bb, nmb, mb), (0, 1, 3, 2, 4))
    bounds = np.r_[0, np.cumsum(np.bincount(group, minlength=pk * nbb * nmb))]
    lhs_first = np.broadcast_to((bs * m + r0 + rs) * kp + kk * kc, (pk, batch, rows)).ravel()[order]
    lhs_iv = np.stack([lhs_first, lhs_first + kc], axis=1)
    lhs_at = np.stack([bounds[v // nnb], bounds[v // nnb + 1]], axis=1)
    # Its block of partials: the same rows, a column block wide.
    kk, bs, rs, ni = np.ix_(np.arange(pk), np.arange(batch), np.arange(rows), np.arange(nnb))
    vid = (((kk * nbb + bs // bb) * nmb + rs // mb) * nnb + ni).ravel()
    order = _grouped(vid, even, (pk, nbb, bb, nmb, mb, nnb), (0, 1, 3, 5, 2, 4))
    offsets = np.r_[0, np.cumsum(np.bincount(vid, minlength=vertices))]
    width = np.broadcast_to(widths[ni], (pk, batch, rows, nnb)).ravel()[order]
    out_first = np.broadcast_to(((kk * batch + bs) * rows + rs) * cols + ni * nb, (pk, batch, rows, nnb)).ravel()[order]
    out_iv = np.stack([out_first, out_first + width], axis=1)
    # rhs: rows k of the K-chunk for each batch element of the block, a
    # column block wide, shared by the block's nmb row-block vertices:
    # group (kk, batch block, column block).
    kk2, bs2, ks, ni2 = np.ix_(np.arange(pk), np.arange(batch), np.arange(kc), np.arange(nnb))
    shape2 = (pk, batch, kc, nnb)
    group2 = np.broadcast_to((kk2 * nbb + bs2 // bb) * nnb + ni2, shape2).ravel()
    order2 = _grouped(group2, batch % bb == 0, (pk, nbb, bb, kc, nnb), (0, 1, 4, 2, 3))
    bounds2 = np.r_[0, np.cumsum(np.bincount(group2, minlength=pk * nbb * nnb))]
    rhs_first = np.broadcast_to((bs2 * kp + kk2 * kc + ks) * n + c0 + ni2 * nb, shape2).ravel()[order2]
    rhs_iv = np.stack([rhs_first, rhs_first + np.broadcast_to(widths[ni2], shape2).ravel()[order2]], axis=1)
    g2 = (v // (nmb * nnb)) * nnb + v % nnb
    rhs_at = np.stack([bounds2[g2], bounds2[g2 + 1]], axis=1)
    # Per vertex: its block's tile and multiply-adds.
    vk, vb, vm, vn = np.unravel_index(v, (pk, nbb, nmb, nnb))
    tiles = tile_of[vk, vb * bb, vm * mb, vn]
    macs = (np.minimum(bb, batch - vb * bb) * np.minimum(mb, rows - vm * mb) * widths[vn] * kc)
    cycles = np.asarray(cost.matmul_cycles(b.target, macs, in_dtype, acc)).astype(np.int64)
    return mapping, tiles, cycles, compact(lhs_iv), lhs_at, compact(rhs_iv), rhs_at, compact(out_iv), offsets


def _reduce_partials(b: Builder, op: ir.Op, partials: View, out: Tensor) -> None:
    reduce_partials(b, op, partials, out, "matmul reduce",
                    lambda n, count: cost.reduce_cycles(b.target, n * count, partials.dtype))


def reduce_partials(b: Builder, op: ir.Op, partials: View, out: Tensor, kind: str, cycles) -> None:
    """out[i] = sum over j of partials[j, i], each tile summing the
    partials of its own elements of out; cycles(elements, partials each)
    of a tile's vertex. `kind` begins the compute set's name."""
    count, size = partials.shape
    codelet = f"ReduceAdd<{partials.dtype.name},{out.dtype.name}>"

    def pattern():
        tiles, intervals, offsets, counts = b.by_tile(out.mapping)
        # Each tile reads its elements' partials, count intervals per interval of out.
        reads = (intervals[:, None, :] + (np.arange(count) * size)[None, :, None]).reshape(-1, 2)
        per_vertex = b.cycles_by_count(counts, lambda n: cycles(n, count))
        return tiles, per_vertex, compact(reads), offsets * count, compact(intervals), offsets
    tiles, per_vertex, reads, read_offsets, intervals, offsets = b.pattern(
        (kind, codelet, count, size, out.mapping), pattern)
    # (The partials view is the whole tensor reshaped, so position j * size
    # + i is read on the tile of out's element i.)
    once = (ReadOnce(out.mapping),) if partials.is_whole_tensor else ()
    vertices = VertexArray(codelet, tiles, per_vertex, ((partials.tensor, reads, read_offsets),),
                           ((out, intervals, offsets),), once)
    b.execute(f"{kind} {name_of(op)}", codelets.ReduceCombine(partials, 0, "add", None, out), vertices)
