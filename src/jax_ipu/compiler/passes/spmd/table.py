"""A gather from a table split along the dimension it is indexed by (an
embedding split by vocabulary, take_along_axis over a vocabulary-split
row), the indices whole: each IPU gathers the rows it holds, zeros for
the others, and the partial results add up to the gather (XLA's SPMD
partitioner does the same), so the table is never gathered whole."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.passes.spmd.sharding import Sharding


def gather_from_split_table(p, op: ir.Op, x: ir.Value, indices: ir.Value) -> bool:
    """Whether the gather was made so (else the caller partitions it)."""
    xs, dn = p.sharding_of(x), op.attrs["dimension_numbers"]
    sharded = [d for d, axes in enumerate(xs.dims) if axes]
    slice_sizes = tuple(op.attrs["slice_sizes"])
    if (len(sharded) != 1 or not p.sharding_of(indices).replicated or sharded[0] not in dn.collapsed_slice_dims
            or sharded[0] not in dn.start_index_map or slice_sizes[sharded[0]] != 1):
        return False
    d = sharded[0]
    axes, full, local = xs.dims[d], op.operands[0].type.shape[d], x.type.shape[d]
    it = indices.type
    scalar = ir.TensorType((), it.dtype)
    ivd = dn.index_vector_dim
    batch_shape = tuple(s for i, s in enumerate(it.shape) if i != ivd)
    bt = ir.TensorType(batch_shape, it.dtype)
    bools = ir.TensorType(batch_shape, np.dtype(np.bool_))
    k = dn.start_index_map.index(d)

    def part(start, stop):
        shape = tuple(stop - start if i == ivd else s for i, s in enumerate(it.shape))
        return p.emit("slice", [indices], ir.TensorType(shape, it.dtype),
                      start_indices=tuple(start if i == ivd else 0 for i in range(len(it.shape))),
                      limit_indices=tuple(stop if i == ivd else s for i, s in enumerate(it.shape)),
                      strides=(1,) * len(it.shape))
    column = indices if ivd == len(it.shape) else p.emit("reshape", [part(k, k + 1)], bt)
    # The gather clamps each start into the table; then it is shifted to this IPU's rows.
    lo = p.broadcast(p.constant(0, it.dtype), batch_shape)
    hi = p.broadcast(p.constant(full - 1, it.dtype), batch_shape)
    clamped = p.emit("clamp", [lo, column, hi], bt)
    first = p.emit("multiply", [p.emit("convert", [p.coordinate(xs.mesh, axes)], scalar),
                                p.constant(local, it.dtype)], scalar)
    shifted = p.emit("subtract", [clamped, p.broadcast(first, batch_shape)], bt)
    mine = p.emit("and", [p.emit("compare", [shifted, lo], bools, comparison_direction="GE", compare_type="SIGNED"),
                          p.emit("compare", [shifted, p.broadcast(p.constant(local, it.dtype), batch_shape)], bools,
                                 comparison_direction="LT", compare_type="SIGNED")], bools)
    if ivd == len(it.shape):
        local_indices = shifted
    else:
        pieces = [part(0, k)] if k else []
        pieces.append(p.emit("reshape", [shifted], ir.TensorType(
            tuple(1 if i == ivd else s for i, s in enumerate(it.shape)), it.dtype)))
        if it.shape[ivd] - k - 1:
            pieces.append(part(k + 1, it.shape[ivd]))
        local_indices = pieces[0] if len(pieces) == 1 else p.emit("concatenate", pieces, it, dimension=ivd)
    rt = op.results[0].type
    rows = p.emit("gather", [x, local_indices], rt, **op.attrs)
    batch_dims = [i for i in range(len(rt.shape)) if i not in dn.offset_dims]
    mask = p.broadcast(mine, rt.shape, batch_dims)
    zeros = p.broadcast(p.constant(0, rt.dtype), rt.shape)
    kept = p.emit("select", [mask, rows, zeros], rt)
    p.env[op.results[0]] = p.set(kept, Sharding(xs.mesh, ((),) * len(rt.shape), frozenset(axes)))
    return True
