"""Rules for ops that make or rearrange data: constants, iota, reshape,
broadcast_in_dim, transpose, slice, concatenate. Reshapes are views;
rearrangements are Copies into a new linearly mapped tensor (an exchange
where elements change tiles, charged by the cost pass). Scalars seen at a
bigger shape stay unmaterialised until an op needs them stored."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.builder import Broadcast, Builder, ScalarBroadcast, Splat
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.graph.views import Concat, View


def name_of(op: ir.Op) -> str:
    return f"{op.name}@{op.loc}"


def copy_to_new(b: Builder, op: ir.Op, src: View | Concat) -> View:
    t = b.tensor(name_of(op), src.shape, src.dtype)
    b.copy(src, t)
    return View(t)


def copy_padded(b: Builder, op: ir.Op, x: View, axis: int, pad: int, fill) -> View:
    """x copied with `pad` elements of `fill` (a numpy scalar, or a view of
    one element) after its elements along `axis`."""
    if not isinstance(fill, View):
        fill = b.constant(f"{name_of(op)}/fill", np.asarray(fill, x.dtype))
    shape = list(x.shape)
    shape[axis] = pad
    return copy_to_new(b, op, Concat((x, fill.then("reshape", ()).then("broadcast", tuple(shape), ())), axis))


def _reshaped(lowered, shape):
    """A Splat or ScalarBroadcast at another shape."""
    if isinstance(lowered, Splat):
        return Splat(lowered.value, shape)
    return ScalarBroadcast(lowered.scalar, shape)


def _as_constant(b: Builder, op: ir.Op, value: np.ndarray):
    """A constant whose elements are all the same bits is a Splat."""
    value = np.asarray(value, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
    if value.size == 0:
        return b.constant(name_of(op), value)
    if value.size == 1 or (value.reshape(-1).view(np.uint8).reshape(value.size, -1) ==
                           value.reshape(-1)[:1].view(np.uint8)).all():
        return Splat(np.asarray(value.flat[0]), value.shape)
    return b.constant(name_of(op), value)


@register("constant")
def constant(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    value = np.asarray(op.attrs["value"]).astype(t.dtype).reshape(t.shape)
    b.values[op.results[0]] = _as_constant(b, op, value)


@register("iota")
def iota(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    dim = op.attrs["iota_dimension"]
    line = np.arange(t.shape[dim]).astype(t.dtype)
    expand = [1] * len(t.shape)
    expand[dim] = t.shape[dim]
    value = np.ascontiguousarray(np.broadcast_to(line.reshape(expand), t.shape))
    b.values[op.results[0]] = _as_constant(b, op, value)


@register("reshape")
def reshape(b: Builder, op: ir.Op) -> None:
    shape = op.results[0].type.shape
    x = b.values[op.operands[0]]
    b.values[op.results[0]] = x.then("reshape", shape) if isinstance(x, View) else _reshaped(x, shape)


@register("broadcast_in_dim")
def broadcast_in_dim(b: Builder, op: ir.Op) -> None:
    shape = op.results[0].type.shape
    dims = tuple(op.attrs["broadcast_dimensions"])
    x = b.values[op.operands[0]]
    if not isinstance(x, View):
        b.values[op.results[0]] = _reshaped(x, shape)
    elif x.size == 1:
        b.values[op.results[0]] = ScalarBroadcast(x.then("reshape", ()), shape)
    elif x.size == int(np.prod(shape)) and list(dims) == sorted(dims):
        b.values[op.results[0]] = x.then("reshape", shape)
    elif op.results[0] in b.lazy_broadcasts and x.is_whole_tensor:
        b.values[op.results[0]] = Broadcast(x, tuple(shape), dims)
    else:
        b.values[op.results[0]] = copy_to_new(b, op, x.then("broadcast", shape, dims))


@register("transpose")
def transpose(b: Builder, op: ir.Op) -> None:
    shape = op.results[0].type.shape
    perm = tuple(op.attrs["permutation"])
    x = b.values[op.operands[0]]
    if not isinstance(x, View):
        b.values[op.results[0]] = _reshaped(x, shape)
    elif perm == tuple(sorted(perm)):
        b.values[op.results[0]] = x
    else:
        b.values[op.results[0]] = copy_to_new(b, op, x.then("transpose", perm))


@register("slice")
def slice_(b: Builder, op: ir.Op) -> None:
    shape = op.results[0].type.shape
    x = b.values[op.operands[0]]
    if not isinstance(x, View):
        b.values[op.results[0]] = _reshaped(x, shape)
        return
    starts, limits = tuple(op.attrs["start_indices"]), tuple(op.attrs["limit_indices"])
    strides = tuple(op.attrs.get("strides") or (1,) * len(starts))
    b.values[op.results[0]] = copy_to_new(b, op, x.then("slice", starts, limits, strides))


@register("concatenate")
def concatenate(b: Builder, op: ir.Op) -> None:
    axis = op.attrs["dimension"]
    parts = tuple(b.view(v, name_of(op)) for v in op.operands if v.type.shape[axis] != 0)
    if not parts:
        parts = (b.view(op.operands[0], name_of(op)),)
    b.values[op.results[0]] = copy_to_new(b, op, Concat(parts, axis) if len(parts) > 1 else parts[0])
