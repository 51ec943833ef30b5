"""dot_general: operands rearranged to [batch, M, K] x [batch, K, N] (a
Copy when that is a layout change), per-tile partial products over K-chunks
as the plan says (fp32 partials for float inputs; K padded with zeros when
only uneven chunks fit), then a cross-tile
reduction of the partials in a fixed order."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder, Splat
from jax_ipu.compiler.layout import copy_to_new, name_of
from jax_ipu.compiler.plan_matmul import plan_matmul
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets
from jax_ipu.graph.compute import Region, Vertex
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import Concat, View


def _canonical(b: Builder, op: ir.Op, value: ir.Value, order: list[int], shape3) -> View:
    """The operand as a whole-tensor view of shape3, its dims in `order`."""
    x = b.view(value, name_of(op))
    if order != sorted(order):
        x = copy_to_new(b, op, x.then("transpose", tuple(order)))
    return x.then("reshape", shape3)


def _rows(first: np.ndarray, length: int) -> np.ndarray:
    """[k, 2] intervals of `length` elements starting at each of `first`."""
    return first[:, None] + np.array([0, length])


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
    acc = np.dtype(np.float32) if out_dtype.kind == "f" else out_dtype
    if batch * m * n == 0 or k == 0:
        b.values[op.results[0]] = Splat(np.zeros((), out_dtype), out_t.shape)
        return
    lhs = _canonical(b, op, op.operands[0], lb + lf + lc, (batch, m, k))
    rhs = _canonical(b, op, op.operands[1], rb + rc + rf, (batch, k, n))
    plan = plan_matmul(b.target, batch, m, n, k, lhs_t.dtype, acc, b.options.available_memory_proportion)
    pb, pm, pn, pk = plan.splits
    bb, mb, nb, kc = plan.blocks
    flops = 2.0 * batch * m * n * k
    if kc * pk != k:        # K padded with zeros to whole chunks (see plan_matmul)
        lhs, rhs = _zero_padded(b, op, lhs, 2, kc * pk - k), _zero_padded(b, op, rhs, 1, kc * pk - k)
        k = kc * pk

    # Partials [pk, batch, m, n]: tile of block (kk, bi, mi, ni).
    tile_of = (((np.arange(pk)[:, None, None, None] * pb + np.arange(batch)[None, :, None, None] // bb) * pm
                + np.arange(m)[None, None, :, None] // mb) * pn + np.arange(n)[None, None, None, :] // nb)
    partials = b.tensor(f"{name_of(op)}/partials", (pk, batch, m, n), acc,
                        TileMapping.from_element_tiles(tile_of))
    vertices = []
    codelet = f"MatMulPartial<{lhs_t.dtype.name},{acc.name}>"
    lhs_regions: dict = {}    # (k-chunk, batch block, row block) -> intervals read
    rhs_regions: dict = {}    # (k-chunk, batch block, column block) -> intervals read
    for kk in range(pk):
        ks = np.arange(kk * kc, (kk + 1) * kc)
        for b0 in range(0, batch, bb):
            bs = np.arange(b0, min(b0 + bb, batch))
            for m0 in range(0, m, mb):
                ms = np.arange(m0, min(m0 + mb, m))
                lhs_key = (kk, b0, m0)
                lhs_regions[lhs_key] = _rows(((bs[:, None] * m + ms) * k + kk * kc).ravel(), kc)
                out_rows = (((kk * batch + bs[:, None]) * m + ms) * n).ravel()
                for n0 in range(0, n, nb):
                    width = min(n0 + nb, n) - n0
                    if (kk, b0, n0) not in rhs_regions:
                        rhs_regions[kk, b0, n0] = _rows(((bs[:, None] * k + ks) * n + n0).ravel(), width)
                    macs = len(bs) * len(ms) * width * kc
                    vertices.append(Vertex(codelet, int(tile_of[kk, b0, m0, n0]),
                                           (Region(lhs.tensor, lhs_regions[lhs_key]),
                                            Region(rhs.tensor, rhs_regions[kk, b0, n0])),
                                           (Region(partials, _rows(out_rows + n0, width)),),
                                           int(cost.matmul_cycles(b.target, macs, lhs_t.dtype))))
    b.execute(f"matmul {name_of(op)} {pb}x{pm}x{pn}x{pk} tiles", codelets.MatMulPartials(lhs, rhs, partials),
              vertices)
    b.flops += flops
    if pk == 1 and acc == out_dtype:
        b.values[op.results[0]] = View(partials).then("reshape", out_t.shape)
        return
    out = b.tensor(name_of(op), (batch * m * n,), out_dtype)
    _reduce_partials(b, op, View(partials).then("reshape", (pk, batch * m * n)), out)
    b.values[op.results[0]] = View(out).then("reshape", out_t.shape)


def _zero_padded(b: Builder, op: ir.Op, x: View, axis: int, pad: int) -> View:
    """x with `pad` zeros after its elements along `axis` (a Copy)."""
    shape = list(x.shape)
    shape[axis] = pad
    zeros = b.constant(f"{name_of(op)}/zero", np.zeros((), x.dtype)).then("broadcast", tuple(shape), ())
    return copy_to_new(b, op, Concat((x, zeros), axis))


def _reduce_partials(b: Builder, op: ir.Op, partials: View, out: Tensor) -> None:
    """out[i] = sum over j of partials[j, i], each tile summing the
    partials of its own elements of out."""
    count, size = partials.shape
    vertices = []
    codelet = f"ReduceAdd<{partials.dtype.name},{out.dtype.name}>"
    for tile in out.mapping.tiles_used():
        intervals = out.mapping.intervals_on(tile)
        reads = (intervals[None] + (np.arange(count) * size)[:, None, None]).reshape(-1, 2)
        n = int((intervals[:, 1] - intervals[:, 0]).sum())
        vertices.append(Vertex(codelet, int(tile), (Region(partials.tensor, reads),),
                               (Region(out, intervals),), cost.reduce_cycles(b.target, n * count, partials.dtype)))
    b.execute(f"matmul reduce {name_of(op)}", codelets.ReduceCombine(partials, 0, "add", None, out), vertices)


RULES = {"dot_general": dot_general}
