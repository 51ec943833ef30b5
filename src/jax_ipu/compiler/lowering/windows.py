"""Windowed ops as a rearrangement Copy plus the planned reduction:
reduce_window gathers each window's elements into [outputs, window] (one
Copy, padding and base-dilation holes filled with the init value, as the
StableHLO spec pads) and reduces the window axis with compiler.reduce (any
body, partials over tiles); select_and_scatter scans each window in
order with its select body (a WindowSelect vertex, as XLA does: first of
equal maxima, NaNs as XLA leaves them, any comparator), then each operand
element reads the source values of the windows that may select it (views
of the source repeated over each stride, no index per element) and
reduces those that did with the scatter body. pad is one Copy of a windows
view (window 1, interior padding as base dilation), reverse one of a window
the size of each axis, reversed on the reversed axes."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Broadcast, Builder, ScalarBroadcast, Splat
from jax_ipu.compiler.lowering import reduce
from jax_ipu.compiler.lowering.elementwise import lower_cluster
from jax_ipu.compiler.lowering.indexing import region_program
from jax_ipu.compiler.lowering.layout import copy_to_new, name_of
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.compiler.passes.fuse import Cluster
from jax_ipu.compiler.planners.windows import attr, axis_windows, combine, padding, row_major_strides, windows
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets
from jax_ipu.graph.compute import Region, Vertex
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.views import View, apply_ops, window_outputs
from jax_ipu.ops import ELEMENTWISE_OPS


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


@register("pad")
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
    rank = len(x_t.shape)
    lows, highs = attr(op, "edge_padding_low", rank, 0), attr(op, "edge_padding_high", rank, 0)
    interior = attr(op, "interior_padding", rank, 0)
    spec = tuple((1, 1, lows[d], highs[d], interior[d] + 1, 1, 0) for d in range(rank))
    b.values[op.results[0]] = copy_to_new(b, op, b.view(op.operands[0], name_of(op)).then(
        "windows", spec, np.asarray(fill, x_t.dtype)[()]).then("reshape", out_t.shape))


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
    return np.broadcast_to(combine(per_axis, row_major_strides(x_t.shape), narrow=True), out_t.shape)


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


@register("reverse")
def reverse(b: Builder, op: ir.Op) -> None:
    shape = op.operands[0].type.shape
    dims = set(op.attrs.get("dimensions") or ())
    lowered = b.values[op.operands[0]]
    if not dims or isinstance(lowered, Splat) or op.operands[0].type.size == 0:
        b.values[op.results[0]] = lowered
        return
    # One window the size of each axis, reversed on the reversed axes.
    spec = tuple((size, 1, 0, 0, 1, 1, int(d in dims)) for d, size in enumerate(shape))
    b.values[op.results[0]] = copy_to_new(b, op, b.view(op.operands[0], name_of(op)).then(
        "windows", spec, None).then("reshape", tuple(shape)))


def _window_attrs(op: ir.Op, rank: int):
    return (attr(op, "window_dimensions", rank, 1), attr(op, "window_strides", rank, 1), padding(op, rank),
            attr(op, "base_dilations", rank, 1), attr(op, "window_dilations", rank, 1))


@register("reduce_window")
def reduce_window(b: Builder, op: ir.Op) -> None:
    n = len(op.operands) // 2
    x_t, out_shape = op.operands[0].type, op.results[0].type.shape
    rank = len(x_t.shape)
    attrs = _window_attrs(op, rank)
    outs = int(np.prod(out_shape, dtype=np.int64))
    window = int(np.prod(attrs[0], dtype=np.int64))
    inits = list(op.operands[n:])
    patches = [_windows_filled(b, op, x, attrs, init, (outs, window)) for x, init in zip(op.operands[:n], inits, strict=True)]
    flat = [_new(ir.TensorType((outs,), r.type.dtype)) for r in op.results]
    reduce.reduce(b, ir.Op("reduce_window", patches + inits, flat, {"dimensions": (1,)}, op.regions, op.loc))
    for r, v in zip(op.results, flat, strict=True):
        lowered = b.values[v]
        b.values[r] = Splat(lowered.value, out_shape) if isinstance(lowered, Splat) else \
            b.view(v).then("reshape", out_shape)


def _windows_filled(b: Builder, op: ir.Op, x: ir.Value, attrs, fill: ir.Value, shape) -> ir.Value:
    """x's windows over every axis as `shape` ([outputs, window]), padding
    and base-dilation holes holding the 0-d value `fill`: one Copy of a
    windows view when fill is a constant; else windows filled with zeros
    and a select on a constant padding mask (a value computed at run time)."""
    spec = _spec(*attrs)
    lowered = b.values[fill]
    if not isinstance(lowered, Splat):
        return _gathered_filled(b, op, x, windows(x.type.shape, *attrs).reshape(shape), fill)
    out = ir.Value(ir.TensorType(tuple(shape), x.type.dtype))
    b.values[out] = copy_to_new(b, op, b.view(x, name_of(op)).then(
        "windows", spec, np.asarray(lowered.value, x.type.dtype)[()]).then("reshape", tuple(shape)))
    return out


def _spec(window, strides, pads, base_dilations, window_dilations) -> tuple:
    """The "windows" view op's spec of a window over every axis."""
    return tuple((w, s, lo, hi, base, dilation, 0) for w, s, (lo, hi), base, dilation
                 in zip(window, strides, pads, base_dilations, window_dilations, strict=True))


def _window_select(b: Builder, op: ir.Op, x: ir.Value, attrs) -> View:
    """Per window of x (attrs: a window over every axis), the window
    position the select body picks: a WindowSelect vertex per tile of the
    result scans its windows, whose elements a Copy of a windows view
    gathers there, window-major (one run per window position on each
    tile)."""
    x_t = x.type
    spec = _spec(*attrs)
    outs = int(np.prod(window_outputs(x_t.shape, spec), dtype=np.int64))
    window = int(np.prod(attrs[0], dtype=np.int64))
    name = name_of(op)
    picked = b.tensor(f"{name}/selected", (outs,), np.uint8 if window < 255 else np.int32)
    mapping = TileMapping.from_element_tiles(np.tile(picked.mapping.element_tiles(), window))
    dtype = x_t.dtype
    values = b.tensor(f"{name}/windows", (window, outs), dtype, mapping)
    b.copy(b.view(x, name).then("windows", spec, np.zeros((), dtype)[()]).then(
        "reshape", (outs, window)).then("transpose", (1, 0)), values)
    padded = None
    if any(lo > 0 or hi > 0 for _, _, lo, hi, *_ in spec):
        mask = np.ascontiguousarray(apply_ops(np.zeros(x_t.shape, bool), (("windows", spec, np.True_),))
                                    .reshape(outs, window).T)
        mask.setflags(write=False)
        padded = b.tensor(f"{name}/padding", (window, outs), np.bool_, mapping, constant=mask)
    program, (result,) = region_program(b, op, op.regions[0])
    # Per window position after the first: the body and two selects (value,
    # position), and two tests more with padding.
    per_element = len(program) + 2 + (2 if padded is not None else 0)
    vertices = []
    for tile in picked.mapping.tiles_used():
        intervals = picked.mapping.intervals_on(tile)
        count = int((intervals[:, 1] - intervals[:, 0]).sum())
        by_row = np.concatenate([intervals + j * outs for j in range(window)])
        reads = tuple(Region(t, by_row) for t in (values, padded) if t is not None)
        vertices.append(Vertex(f"WindowSelect<{dtype.name}>", int(tile), reads, (Region(picked, intervals),),
                               cost.reduce_cycles(b.target, count * (window - 1) * per_element, dtype)))
    b.execute(f"select {name}", codelets.WindowSelect(
        View(values), None if padded is None else View(padded), program, result, picked), vertices)
    b.flops += outs * (window - 1) * len(program)
    return View(picked)


def _scatter(b: Builder, op: ir.Op, picked: View, window, strides, pads) -> None:
    """Each operand element, from the init value, applies the scatter body
    to the source value of every window that picked it, in XLA's order
    (windows in row-major order, in the operand's type): one fused
    element-wise chain over the J windows that may contain an element
    (per axis, the k-th last window starting at or before it). The source
    values and picked positions of the k-th are patterns, views of the
    source repeated over each stride and shifted (no index per element);
    the element's position in it is a sum of one small constant per axis,
    broadcast."""
    x, source, init = op.operands
    x_t, scatter = x.type, op.regions[1]
    shape, out_shape = x_t.shape, source.type.shape
    src = b.view(source)
    never = np.array(np.iinfo(picked.dtype).max, picked.dtype)   # no window: matches no position
    counts = [-(-w // st) for w, st in zip(window, strides, strict=True)]
    window_strides = row_major_strides(window)
    ops: list[ir.Op] = []
    total = init
    for ks in np.ndindex(*counts):
        # Window k-th from last per axis: o = (x + pad) // stride - m, m = count - 1 - k,
        # holding x when its phase (x + pad) % stride < window - m * stride.
        ms = [c - 1 - k for c, k in zip(counts, ks, strict=True)]
        valid = [min(st, w - m * st) for st, w, m in zip(strides, window, ms, strict=True)]
        if min(valid, default=1) <= 0:
            continue
        value = _strided_windows(b, op, src, shape, strides, pads, ms, valid, np.zeros((), source.type.dtype)[()])
        chosen = _strided_windows(b, op, picked.then("reshape", out_shape), shape, strides, pads, ms, valid,
                                  never[()])
        here = _positions(b, op, shape, strides, pads, ms, window, window_strides, picked.dtype, ops)
        hit = _op("compare", [chosen, here], np.bool_, shape, comparison_direction="EQ",
                  compare_type="UNSIGNED" if picked.dtype.kind == "u" else "SIGNED")
        ops.append(hit)
        (applied,) = _clone(b, scatter, [total, value], ops, shape)
        ops.append(_op("select", [hit.results[0], applied, total], x_t.dtype, shape))
        total = ops[-1].results[0]
    for o in ops:     # (k = count - 1 on every axis holds some elements: never empty)
        o.loc = op.loc
    lower_cluster(b, Cluster(tuple(shape), ops), {total})
    b.values[op.results[0]] = b.values[total]


def _strided_windows(b: Builder, op: ir.Op, src: View, shape, strides, pads, ms, valid, fill) -> ir.Value:
    """[shape]: at each element x, src[(x + pad) // stride - m] along every
    axis, or `fill` outside src or in a phase (x + pad) % stride >= valid:
    src with each element repeated `valid` times and padded to `stride`,
    then shifted by pad - m * stride (a windows view of window 1)."""
    rank = len(shape)
    outs = src.shape
    spread = src.then("reshape", tuple(d for o in outs for d in (o, 1)))
    spread = spread.then("broadcast", tuple(d for o, v in zip(outs, valid, strict=True) for d in (o, v)), tuple(range(2 * rank)))
    spread = spread.then("windows", tuple(spec for v, st in zip(valid, strides, strict=True)
                                          for spec in ((1, 1, 0, 0, 1, 1, 0), (1, 1, 0, st - v, 1, 1, 0))), fill)
    repeated = tuple(o * st for o, st in zip(outs, strides, strict=True))
    spread = spread.then("reshape", repeated)
    shift = [p[0] - m * st for p, m, st in zip(pads, ms, strides, strict=True)]
    spread = spread.then("windows", tuple((1, 1, -sh, n - r + sh, 1, 1, 0)
                                          for sh, n, r in zip(shift, shape, repeated, strict=True)), fill)
    out = ir.Value(ir.TensorType(tuple(shape), src.dtype))
    b.values[out] = copy_to_new(b, op, spread.then("reshape", tuple(shape)))
    return out


def _positions(b: Builder, op: ir.Op, shape, strides, pads, ms, window, window_strides, dtype, ops) -> ir.Value:
    """[shape]: each element's position in the window (k-th from last per
    axis) that may hold it, sum over axes of ((x + pad) % stride + m *
    stride) * the window's row-major stride: one constant per axis of a
    window wider than 1, broadcast, and added in the chain."""
    total = None
    for d, (n, st, p, m, w, ws) in enumerate(zip(shape, strides, pads, ms, window, window_strides, strict=True)):
        if w == 1:
            continue
        along = ((np.arange(n) + p[0]) % st + m * st) * ws
        term = _new(ir.TensorType(tuple(shape), np.dtype(dtype)))
        b.values[term] = Broadcast(b.constant(f"{name_of(op)}/window positions", along.astype(dtype)),
                                   tuple(shape), (d,))
        if total is None:
            total = term
        else:
            ops.append(_op("add", [total, term], dtype, shape))
            total = ops[-1].results[0]
    if total is None:
        total = _new(ir.TensorType(tuple(shape), np.dtype(dtype)))
        b.values[total] = Splat(np.zeros((), dtype), tuple(shape))
    return total


def _clone(b: Builder, block: ir.Block, args: list[ir.Value], into: list[ir.Op], shape) -> list[ir.Value]:
    """Appends block's ops, applied element-wise at `shape` to `args`, to
    `into` (its constants become immediates); returns its results."""
    env = dict(zip(block.args, args, strict=True))
    for inner in block.ops:
        if inner.name == "constant":
            result = inner.results[0]
            b.values[result] = Splat(np.asarray(inner.attrs["value"]).astype(result.type.dtype).reshape(()), ())
            continue
        if inner.name not in ELEMENTWISE_OPS:
            raise IpuUnimplementedError.for_op(inner, f"a scatter body with stablehlo.{inner.name} is not "
                                                      "supported (bodies may hold element-wise ops)",
                                               "File an issue")
        results = [_new(ir.TensorType(tuple(shape), r.type.dtype)) for r in inner.results]
        into.append(ir.Op(inner.name, [env.get(v, v) for v in inner.operands], results, inner.attrs))
        env.update(zip(inner.results, results, strict=True))
    return [env.get(v, v) for v in block.results]


@register("select_and_scatter")
def select_and_scatter(b: Builder, op: ir.Op) -> None:
    x, source, init = op.operands
    x_t = x.type
    rank = len(x_t.shape)
    window, strides, pads = (attr(op, "window_dimensions", rank, 1), attr(op, "window_strides", rank, 1),
                             padding(op, rank))
    ones = (1,) * rank
    out_shape = source.type.shape
    outs, size = int(np.prod(out_shape, dtype=np.int64)), x_t.size
    if size == 0 or outs == 0:
        value = np.zeros((), x_t.dtype) if size == 0 else _constant_scalar(b, op, init, "init value")
        b.values[op.results[0]] = Splat(value, x_t.shape)
        return
    picked = _window_select(b, op, x, (window, strides, pads, ones, ones))
    _scatter(b, op, picked, window, strides, pads)
