"""This IPU's slice of a value every IPU computed whole, made from the
slices of what it is made of (a broadcast, an iota, a scatter into
zeros: one-hot masks, the gradients of an embedding or of a
take_along_axis), so that the whole value need not exist on any IPU
(it is then dead code)."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.ops import ELEMENTWISE_OPS


def made_locally(p, value: ir.Value, dim: int, mesh, axes, start: ir.Value, shape: tuple) -> ir.Value | None:
    """The slice, or None where `value`'s maker has no rule (then it is sliced)."""
    op = p.producer.get(value)
    if op is None:
        return None
    rule = RULES.get(op.name)
    if rule is None and op.name in ELEMENTWISE_OPS and all(
            getattr(v.type, "shape", None) in (op.results[0].type.shape, ()) for v in op.operands):
        rule = _elementwise
    return None if rule is None else rule(p, op, dim, mesh, axes, start, shape)


def _elementwise(p, op: ir.Op, dim, mesh, axes, start, shape):
    full = op.results[0].type.shape
    operands = [p.slice_dim(v, dim, mesh, axes) if v.type.shape == full else v for v in op.operands]
    return p.emit(op.name, operands, ir.TensorType(shape, op.results[0].type.dtype), **op.attrs)


def _broadcast(p, op: ir.Op, dim, mesh, axes, start, shape):
    x, = op.operands
    bd = tuple(op.attrs["broadcast_dimensions"])
    if dim in bd and x.type.shape[bd.index(dim)] != 1:
        x = p.slice_dim(x, bd.index(dim), mesh, axes)
    return p.broadcast(x, shape, bd)


def _iota(p, op: ir.Op, dim, mesh, axes, start, shape):
    t = ir.TensorType(shape, op.results[0].type.dtype)
    local = p.emit("iota", [], t, **op.attrs)
    if op.attrs["iota_dimension"] != dim:
        return local
    first = p.emit("convert", [start], ir.TensorType((), t.dtype))
    return p.emit("add", [local, p.broadcast(first, shape)], t)


def _transpose(p, op: ir.Op, dim, mesh, axes, start, shape):
    perm = tuple(op.attrs["permutation"])
    x = p.slice_dim(op.operands[0], perm[dim], mesh, axes)
    return p.emit("transpose", [x], ir.TensorType(shape, op.results[0].type.dtype), permutation=perm)


def _scatter(p, op: ir.Op, dim, mesh, axes, start, shape):
    """Scattering into this IPU's rows: the indices shifted by its first
    row; an update out of its rows is skipped, as scatter skips an update
    out of bounds (each update writes one row along `dim`)."""
    if len(op.operands) != 3:
        return None
    x, indices, updates = op.operands
    dn = op.attrs["scatter_dimension_numbers"]
    if dim not in dn.inserted_window_dims or dim not in dn.scatter_dims_to_operand_dims:
        return None
    it = indices.type
    ivd = dn.index_vector_dim
    k = dn.scatter_dims_to_operand_dims.index(dim)
    kvec = it.shape[ivd] if ivd < len(it.shape) else 1
    offsets = np.zeros(kvec, it.dtype)
    offsets[k] = 1
    vector = p.emit("multiply", [p.emit("constant", [], ir.TensorType((kvec,), it.dtype), value=offsets),
                                 p.broadcast(p.emit("convert", [start], ir.TensorType((), it.dtype)), (kvec,))],
                    ir.TensorType((kvec,), it.dtype))
    if ivd < len(it.shape):
        shift = p.broadcast(vector, it.shape, (ivd,))
    else:
        shift = p.broadcast(p.emit("reshape", [vector], ir.TensorType((), it.dtype)), it.shape)
    shifted = p.emit("subtract", [indices, shift], it)
    local_x = p.slice_dim(x, dim, mesh, axes)
    return p.emit("scatter", [local_x, shifted, updates], ir.TensorType(shape, op.results[0].type.dtype),
                  regions=op.regions, **op.attrs)


def _all_reduce(p, op: ir.Op, dim, mesh, axes, start, shape):
    """This IPU's slice of a sum over the IPUs it is sliced over: a
    reduce_scatter (XLA's partitioner makes the same of an all_reduce whose
    users take slices: ZeRO-1's gradients, split like the optimizer state).
    Each IPU receives its part only, half the link traffic of the ring
    all_reduce; the whole sum need not exist."""
    if len(op.operands) != 1 or not np.array_equal(op.attrs["replica_groups"], p.groups(mesh, axes)):
        return None
    result = ir.Value(ir.TensorType(shape, op.results[0].type.dtype))
    p.ops.append(ir.Op("reduce_scatter", list(op.operands), [result],
                       {"replica_groups": p.groups(mesh, axes), "use_global_device_ids": True,
                        "scatter_dimension": dim}, op.regions, p.loc))
    return result


RULES = {"broadcast_in_dim": _broadcast, "iota": _iota, "scatter": _scatter, "transpose": _transpose,
         "all_reduce": _all_reduce}
