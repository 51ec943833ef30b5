"""Windowed ops as a rearrangement Copy plus the planned reduction:
reduce_window gathers each window's elements into [outputs, window] (one
Copy, padding and base-dilation holes filled with the init value, as the
StableHLO spec pads) and reduces the window axis with compiler.reduce (any
body, partials over tiles); select_and_scatter selects with a two-operand
reduction (value, operand position; ties go to the first position, as
XLA's sequential scan), then each operand element gathers the source
values of the windows that may select it and reduces those that did with
the scatter body. pad and reverse are single gather Copies."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import reduce
from jax_ipu.compiler.builder import Builder, ScalarBroadcast, Splat
from jax_ipu.compiler.elementwise import lower_cluster
from jax_ipu.compiler.fuse import Cluster
from jax_ipu.compiler.layout import copy_to_new, name_of
from jax_ipu.compiler.window_index import attr, axis_windows, combine, padding, row_major_strides, windows
from jax_ipu.errors import IpuUnimplementedError

_NONE = np.iinfo(np.int32).max     # the position of padding: never preferred


def _constant_scalar(b: Builder, op: ir.Op, value: ir.Value, what: str) -> np.ndarray:
    lowered = b.values[value]
    if not isinstance(lowered, Splat):
        raise IpuUnimplementedError.for_op(op, f"a {what} computed at run time is not supported",
                                           "Use a constant, or file an issue")
    return lowered.value


def _gathered(b: Builder, op: ir.Op, value: ir.Value, indices: np.ndarray, fill) -> ir.Value:
    out = ir.Value(ir.TensorType(tuple(indices.shape), value.type.dtype))
    b.values[out] = copy_to_new(b, op, b.view(value, name_of(op)).then(
        "gather", np.asarray(indices, order="C"), fill))   # (ascontiguousarray makes 0-d arrays 1-d)
    return out


def _gathered_filled(b: Builder, op: ir.Op, value: ir.Value, indices: np.ndarray, fill: ir.Value) -> ir.Value:
    """_gathered with the 0-d value `fill` where indices < 0: an immediate
    when it is a constant, else a select on a constant mask after the
    gather (a value computed at run time)."""
    lowered = b.values[fill]
    if isinstance(lowered, Splat):
        return _gathered(b, op, value, indices, lowered.value)
    dtype = value.type.dtype
    gathered = _gathered(b, op, value, indices, np.zeros((), dtype))
    if not (indices < 0).any():
        return gathered
    shape = tuple(indices.shape)
    mask = _new(ir.TensorType(shape, np.dtype(np.bool_)))
    b.values[mask] = b.constant(f"{name_of(op)}/padding mask", np.asarray(indices < 0, order="C"))
    select = _op("select", [mask, fill, gathered], dtype, shape)
    select.loc = op.loc
    lower_cluster(b, Cluster(shape, [select]), {select.results[0]})
    return select.results[0]


def _new(type_: ir.TensorType) -> ir.Value:
    return ir.Value(type_)


def _op(name: str, operands: list, dtype, shape=(), **attrs) -> ir.Op:
    return ir.Op(name, list(operands), [_new(ir.TensorType(tuple(shape), np.dtype(dtype)))], attrs)


def pad(b: Builder, op: ir.Op) -> None:
    x_t, out_t = op.operands[0].type, op.results[0].type
    if out_t.size == 0:
        b.values[op.results[0]] = Splat(np.zeros((), out_t.dtype), out_t.shape)
        return
    if not isinstance(b.values[op.operands[1]], Splat):
        _pad_with_run_time_value(b, op)
        return
    fill = b.values[op.operands[1]].value
    if x_t.size == 0:
        b.values[op.results[0]] = Splat(fill, out_t.shape)
        return
    b.values[op.results[0]] = b.values[_gathered(b, op, op.operands[0], _pad_indices(op), fill)]


def _pad_indices(op: ir.Op) -> np.ndarray:
    """Per result element, the flat operand element it is, or -1 (padding)."""
    x_t, out_t = op.operands[0].type, op.results[0].type
    rank = len(x_t.shape)
    lows, highs = attr(op, "edge_padding_low", rank, 0), attr(op, "edge_padding_high", rank, 0)
    interior = attr(op, "interior_padding", rank, 0)
    if x_t.size == 0:
        return np.full(out_t.shape, -1)
    per_axis = []
    for d in range(rank):
        idx = axis_windows(x_t.shape[d], 1, 1, (lows[d], highs[d]), interior[d] + 1, 1, out_t.shape[d])[:, 0]
        shape = [1] * rank
        shape[d] = out_t.shape[d]
        per_axis.append(idx.reshape(shape))
    return np.broadcast_to(combine(per_axis, row_major_strides(x_t.shape)), out_t.shape)


def _pad_with_run_time_value(b: Builder, op: ir.Op) -> None:
    """pad whose padding value is computed on the device: the gather pads
    with zeros, then one element-wise select puts the value where a
    constant mask says padding."""
    x, value = op.operands
    out_t = op.results[0].type
    indices = _pad_indices(op)
    if x.type.size == 0:
        b.values[op.results[0]] = ScalarBroadcast(b.view(value).then("reshape", ()), out_t.shape)
        return
    b.values[op.results[0]] = b.values[_gathered_filled(b, op, x, indices, value)]


def reverse(b: Builder, op: ir.Op) -> None:
    shape = op.operands[0].type.shape
    dims = set(op.attrs.get("dimensions") or ())
    lowered = b.values[op.operands[0]]
    if not dims or isinstance(lowered, Splat) or op.operands[0].type.size == 0:
        b.values[op.results[0]] = lowered
        return
    per_axis = []
    for d, size in enumerate(shape):
        idx = np.arange(size)[::-1] if d in dims else np.arange(size)
        expand = [1] * len(shape)
        expand[d] = size
        per_axis.append(idx.reshape(expand))
    indices = np.broadcast_to(combine(per_axis, row_major_strides(shape)), shape)
    b.values[op.results[0]] = b.values[_gathered(b, op, op.operands[0], indices, None)]


def _window_attrs(op: ir.Op, rank: int):
    return (attr(op, "window_dimensions", rank, 1), attr(op, "window_strides", rank, 1), padding(op, rank),
            attr(op, "base_dilations", rank, 1), attr(op, "window_dilations", rank, 1))


def reduce_window(b: Builder, op: ir.Op) -> None:
    n = len(op.operands) // 2
    x_t, out_shape = op.operands[0].type, op.results[0].type.shape
    rank = len(x_t.shape)
    indices = windows(x_t.shape, *_window_attrs(op, rank))
    outs = int(np.prod(out_shape, dtype=np.int64))
    window = int(np.prod(indices.shape[rank:], dtype=np.int64))
    indices = indices.reshape(outs, window)
    inits = list(op.operands[n:])
    if x_t.size == 0:
        indices = np.full(indices.shape, -1)
    patches = [_gathered_filled(b, op, x, indices, init) for x, init in zip(op.operands[:n], inits)]
    flat = [_new(ir.TensorType((outs,), r.type.dtype)) for r in op.results]
    reduce.reduce(b, ir.Op("reduce_window", patches + inits, flat, {"dimensions": (1,)}, op.regions, op.loc))
    for r, v in zip(op.results, flat):
        lowered = b.values[v]
        b.values[r] = Splat(lowered.value, out_shape) if isinstance(lowered, Splat) else \
            b.view(v).then("reshape", out_shape)


def _clone(block: ir.Block, args: list[ir.Value], into: list[ir.Op]) -> list[ir.Value]:
    """Appends block's ops applied to `args` (fresh values) to `into`."""
    env = dict(zip(block.args, args))
    for inner in block.ops:
        results = [_new(r.type) for r in inner.results]
        into.append(ir.Op(inner.name, [env[v] for v in inner.operands], results, inner.attrs, inner.regions,
                          inner.loc))
        env.update(zip(inner.results, results))
    return [env[v] for v in block.results]


def _select_body(select: ir.Block, dtype: np.dtype) -> ir.Block:
    """(value, position) pairs -> the pair `select` prefers; on a tie (each
    prefers the other) the smaller position."""
    va, ia, vb, ib = (_new(ir.TensorType((), d)) for d in (dtype, np.int32, dtype, np.int32))
    ops: list[ir.Op] = []
    (a_first,) = _clone(select, [va, vb], ops)
    (b_first,) = _clone(select, [vb, va], ops)
    steps = [_op("compare", [ia, ib], np.bool_, comparison_direction="LT", compare_type="SIGNED")]
    steps.append(_op("not", [b_first], np.bool_))
    steps.append(_op("or", [steps[1].results[0], steps[0].results[0]], np.bool_))
    steps.append(_op("and", [a_first, steps[2].results[0]], np.bool_))
    pick = steps[3].results[0]
    steps.append(_op("select", [pick, va, vb], dtype))
    steps.append(_op("select", [pick, ia, ib], np.int32))
    ops += steps
    return ir.Block([va, ia, vb, ib], ops, [steps[4].results[0], steps[5].results[0]])


def _fill_never_selected(op: ir.Op, select: ir.Block, dtype: np.dtype):
    """A padding value `select` never prefers to a real element."""
    compares = [o for o in select.ops if o.name == "compare"]
    direction = compares[0].attrs.get("comparison_direction") if len(compares) == 1 else None
    if direction not in ("GE", "GT", "LE", "LT"):
        raise IpuUnimplementedError.for_op(op, "select_and_scatter with a select body other than one "
                                               "comparison is not supported", "File an issue")
    low = direction in ("GE", "GT")
    if dtype.kind == "f":
        return np.array(-np.inf if low else np.inf, dtype)
    info = np.iinfo(dtype) if dtype != np.bool_ else None
    return np.array((info.min if low else info.max) if info else (not low), dtype)


def select_and_scatter(b: Builder, op: ir.Op) -> None:
    x, source, init = op.operands
    x_t, dtype = x.type, x.type.dtype
    rank = len(x_t.shape)
    window, strides, pads = (attr(op, "window_dimensions", rank, 1), attr(op, "window_strides", rank, 1),
                             padding(op, rank))
    ones = (1,) * rank
    indices = windows(x_t.shape, window, strides, pads, ones, ones)
    out_shape = source.type.shape
    outs, size = int(np.prod(out_shape, dtype=np.int64)), x_t.size
    indices = indices.reshape(outs, -1)
    if size == 0 or outs == 0:
        value = np.zeros((), dtype) if size == 0 else _constant_scalar(b, op, init, "init value")
        b.values[op.results[0]] = Splat(value, x_t.shape)
        return
    select, scatter = op.regions

    # 1. Per window, the operand position its select body picks.
    values = _gathered(b, op, x, indices, _fill_never_selected(op, select, dtype))
    positions = _new(ir.TensorType(indices.shape, np.dtype(np.int32)))
    b.values[positions] = b.constant(f"{name_of(op)}/positions", np.where(indices < 0, _NONE, indices)
                                     .astype(np.int32))
    none = _new(ir.TensorType((), np.dtype(np.int32)))
    b.values[none] = Splat(np.array(_NONE, np.int32), ())
    lowest = _new(ir.TensorType((), dtype))
    b.values[lowest] = Splat(_fill_never_selected(op, select, dtype), ())
    picked_value = _new(ir.TensorType((outs,), dtype))
    picked = _new(ir.TensorType((outs,), np.dtype(np.int32)))
    reduce.reduce(b, ir.Op("select_and_scatter", [values, positions, lowest, none], [picked_value, picked],
                           {"dimensions": (1,)}, [_select_body(select, dtype)], op.loc))

    # 2. Per operand element, the windows that may pick it (J of them).
    per_axis, counts = [], []
    for d in range(rank):
        count = -(-window[d] // strides[d])
        q = np.arange(x_t.shape[d])[:, None] + pads[d][0]
        o = q // strides[d] - np.arange(count)[None, :]
        valid = (o >= 0) & (o < out_shape[d]) & (q - o * strides[d] < window[d])
        expand = [1] * (2 * rank)
        expand[d], expand[rank + d] = x_t.shape[d], count
        per_axis.append(np.where(valid, o, -1).reshape(expand))
        counts.append(count)
    contributors = np.broadcast_to(combine(per_axis, row_major_strides(out_shape)),
                                   tuple(x_t.shape) + tuple(counts)).reshape(size, -1)
    init_value = _constant_scalar(b, op, init, "init value")
    flat_source = _new(ir.TensorType((outs,), source.type.dtype))
    b.values[flat_source] = b.view(source).then("reshape", (outs,))
    sources = _gathered(b, op, flat_source, contributors, init_value)
    chosen = _gathered(b, op, picked, contributors, np.array(-1, np.int32))
    here = _new(ir.TensorType(contributors.shape, np.dtype(np.int32)))
    b.values[here] = b.constant(f"{name_of(op)}/operand positions", np.broadcast_to(
        np.arange(size, dtype=np.int32)[:, None], contributors.shape))
    init_full = _new(ir.TensorType(contributors.shape, dtype))
    b.values[init_full] = Splat(np.asarray(init_value, dtype), contributors.shape)
    hit = _op("compare", [chosen, here], np.bool_, contributors.shape, comparison_direction="EQ",
              compare_type="SIGNED")
    masked = _op("select", [hit.results[0], sources, init_full], dtype, contributors.shape)
    for o in (hit, masked):
        o.loc = op.loc
    lower_cluster(b, Cluster(contributors.shape, [hit, masked]), {masked.results[0]})

    # 3. The scatter body over each element's contributions, from init.
    total = _new(ir.TensorType((size,), dtype))
    reduce.reduce(b, ir.Op("select_and_scatter", [masked.results[0], init], [total], {"dimensions": (1,)},
                           [scatter], op.loc))
    lowered = b.values[total]
    b.values[op.results[0]] = Splat(lowered.value, x_t.shape) if isinstance(lowered, Splat) else \
        b.view(total).then("reshape", x_t.shape)


RULES = {"pad": pad, "reverse": reverse, "reduce_window": reduce_window,
         "select_and_scatter": select_and_scatter}
