"""convolution, as Poplar's convolutions run: planned (compiler.planners.conv)
over tiles by conv groups, batch, output field, input channels, output
channels and kernel positions; each tile receives its input region (its
field block and the halo its kernel positions reach) and its kernel block
once, and one AMP vertex walks the kernel positions over them in place
(a ConvPartials compute set: no patch matrix is made); partial sums of
the input-channel and kernel-position chunks are then added up across
tiles (ConvReduce), and the result laid out as the op's output.

Every attribute of stablehlo.convolution is taken: strides, padding
(negative crops), lhs and rhs dilation, window reversal, feature and
batch groups (the conv groups; the StableHLO spec splits them so), any
dimension order (an input whose channels are not innermost is copied into
a layout whose are first, as Poplar rearranges a convolution's input).
What the plan does not take falls back to an im2col matmul
(lowering/conv_im2col.py), named in its compute sets and logged."""
from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost, cost_conv
from jax_ipu.compiler.builder import Builder, Splat
from jax_ipu.compiler.lowering import conv_im2col
from jax_ipu.compiler.lowering.layout import copy_to_new, name_of
from jax_ipu.compiler.lowering.matmul import partials_type, reduce_partials
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.compiler.planners.conv import ConvPlan, ConvProblem, compute_cycles, plan_conv
from jax_ipu.compiler.planners.windows import attr, out_size, padding
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets
from jax_ipu.graph.codelets_conv import ConvPartials
from jax_ipu.graph.compute import Rows, SharedRows, VertexArray, compact
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.views import Concat, View

log = logging.getLogger(__name__)

# A spatial axis whose outputs times window positions exceed this is left
# to the im2col path (the plan works out which input elements each pair
# reads, per axis).
MAX_AXIS_PAIRS = 1 << 22


@dataclasses.dataclass(frozen=True)
class _Conv:
    """What the lowering reads off the op, per conv group."""
    groups: int
    batch_groups: int
    feature_groups: int
    batch: int                  # per group
    in_chans: int               # per group
    out_chans: int              # per group
    in_sizes: tuple
    window: tuple
    outs: tuple
    spec: tuple                 # per spatial dimension: the "windows" view op's


def _read(op: ir.Op) -> _Conv:
    dn = op.attrs["dimension_numbers"]
    lhs_t, rhs_t, out_t = op.operands[0].type, op.operands[1].type, op.results[0].type
    spatial = len(dn.input_spatial_dimensions)
    strides = attr(op, "window_strides", spatial, 1)
    lhs_dilation = attr(op, "lhs_dilation", spatial, 1)
    rhs_dilation = attr(op, "rhs_dilation", spatial, 1)
    pads = padding(op, spatial)
    reversal = tuple(bool(r) for r in (op.attrs.get("window_reversal") or (False,) * spatial))
    groups_f = int(op.attrs.get("feature_group_count") or 1)
    groups_b = int(op.attrs.get("batch_group_count") or 1)
    groups = max(groups_f, groups_b)
    window = tuple(rhs_t.shape[d] for d in dn.kernel_spatial_dimensions)
    in_sizes = tuple(lhs_t.shape[d] for d in dn.input_spatial_dimensions)
    outs = tuple(out_t.shape[d] for d in dn.output_spatial_dimensions)
    for d in range(spatial):
        expected = out_size(in_sizes[d], window[d], strides[d], pads[d], lhs_dilation[d], rhs_dilation[d])
        if expected != outs[d]:
            raise IpuUnimplementedError.for_op(op, f"output size {outs[d]} of spatial dimension {d} "
                                                   f"differs from the computed {expected}", "Please report it")
    spec = tuple((window[d], strides[d], pads[d][0], pads[d][1], lhs_dilation[d], rhs_dilation[d], int(reversal[d]))
                 for d in range(spatial))
    return _Conv(groups, groups_b, groups_f, lhs_t.shape[dn.input_batch_dimension] // groups_b,
                 rhs_t.shape[dn.kernel_input_feature_dimension],
                 rhs_t.shape[dn.kernel_output_feature_dimension] // groups, in_sizes, window, outs, spec)


@register("convolution")
def convolution(b: Builder, op: ir.Op) -> None:
    lhs, rhs = op.operands
    lhs_t, rhs_t, out_t = lhs.type, rhs.type, op.results[0].type
    if lhs_t.dtype != rhs_t.dtype or lhs_t.dtype.kind not in "fiu":
        raise IpuUnimplementedError.for_op(
            op, f"convolution of {lhs_t} and {rhs_t} is not supported",
            "Use numeric operands of one type, or file an issue")
    c = _read(op)
    if out_t.size == 0 or lhs_t.size == 0 or rhs_t.size == 0:
        # Nothing to read (an empty input: the output is all padding): zeros.
        b.values[op.results[0]] = Splat(np.zeros((), out_t.dtype), out_t.shape)
        return
    reason = _unplanned(c)
    if reason is not None:
        log.info("convolution at %s: %s; lowered as an im2col matmul", op.loc, reason)
        conv_im2col.convolution(b, op, c, reason)
        return
    _planned(b, op, c)


def _unplanned(c: _Conv) -> str | None:
    """Why the planned path does not take a convolution, or None."""
    if not c.spec:
        # No spatial dimension: a batched matrix product, which the matmul
        # planner places (the conv planner's worklists walk a field).
        return "no spatial dimension (a product of feature vectors)"
    for (window, *_), out in zip(c.spec, c.outs, strict=True):
        if window * out > MAX_AXIS_PAIRS:
            return f"a window of {window} over {out} outputs"
    return None


# -- layouts ------------------------------------------------------------
# A tensor's axes, each split where it holds two roles (the batch and its
# groups, the features and theirs): [(role, size)] in the tensor's order.
# Roles: "g" conv group, "n" batch, "c" input channel, "o" output channel,
# ("s", d) spatial dimension d, ("k", d) kernel dimension d.

def _lhs_axes(op: ir.Op, c: _Conv) -> list:
    dn = op.attrs["dimension_numbers"]
    axes = []
    for a in range(len(op.operands[0].type.shape)):
        if a == dn.input_batch_dimension:
            axes += [("g", c.batch_groups), ("n", c.batch)]
        elif a == dn.input_feature_dimension:
            axes += [("g", c.feature_groups), ("c", c.in_chans)] if c.batch_groups == 1 else [("c", c.in_chans)]
        else:
            d = dn.input_spatial_dimensions.index(a)
            axes.append((("s", d), c.in_sizes[d]))
    return [x for x in axes if x != ("g", 1)] if c.groups == 1 else [x for x in axes if x[1] != 1 or x[0] != "g"]


def _rhs_axes(op: ir.Op, c: _Conv) -> list:
    dn = op.attrs["dimension_numbers"]
    axes = []
    for a in range(len(op.operands[1].type.shape)):
        if a == dn.kernel_input_feature_dimension:
            axes.append(("c", c.in_chans))
        elif a == dn.kernel_output_feature_dimension:
            axes += [("g", c.groups), ("o", c.out_chans)]
        else:
            d = dn.kernel_spatial_dimensions.index(a)
            axes.append((("k", d), c.window[d]))
    return axes


def _with_unit_roles(axes: list, roles: list) -> list:
    """axes with a size-1 axis for each role of `roles` they lack, leading."""
    present = {r for r, _ in axes}
    return [(r, 1) for r in roles if r not in present] + axes


def _view_as(tensor_view: View, axes: list, roles: list) -> View:
    """The whole tensor (read in its own order) seen as [roles...]."""
    axes = _with_unit_roles(axes, roles)
    order = [r for r, _ in axes]
    return tensor_view.then("reshape", tuple(s for _, s in axes)).then(
        "transpose", tuple(order.index(r) for r in roles))


def _nonunit_order(axes: list) -> list:
    return [r for r, s in axes if s > 1]


def _input_layout(axes: list, batch_inner: bool) -> bool:
    """Whether a tensor laid out as `axes` may be the AMP's input: its
    channels innermost and, with batch_inner, the batch next (size-1 axes
    aside), the spatial axes in order."""
    order = _nonunit_order(axes)
    if order and order[-1] != "c" and any(r == "c" for r, s in axes if s > 1):
        return False
    rest = [r for r in order if r != "c"]
    spatial = [r for r in rest if isinstance(r, tuple)]
    if spatial != sorted(spatial):
        return False
    if batch_inner:
        return "n" not in rest or rest[-1] == "n"
    return "n" not in rest or not spatial or rest.index("n") < rest.index(spatial[0])


def _input_roles(spatial: int, batch_inner: bool) -> list:
    field = [("s", d) for d in range(spatial)]
    return ["g", *field, "n", "c"] if batch_inner else ["g", "n", *field, "c"]


# -- block index arithmetic -----------------------------------------------

def block_intervals(sizes, index_sets) -> np.ndarray:
    """[k, 2] intervals of the flat (C order) elements of an array of
    `sizes` whose index along each axis is in that axis's sorted set: a
    run per index of the outer axes, along the innermost axis the set does
    not fill, in maximal steps of consecutive indices."""
    if any(len(s) == 0 for s in index_sets):
        return np.zeros((0, 2), np.int64)
    strides = np.cumprod((1,) + tuple(sizes[::-1]))[:-1][::-1]
    j = len(sizes) - 1
    while j >= 0 and len(index_sets[j]) == sizes[j]:
        j -= 1
    if j < 0:
        return np.array([[0, int(np.prod(sizes, dtype=np.int64))]], np.int64)
    idx = np.asarray(index_sets[j], np.int64)
    cuts = np.flatnonzero(np.diff(idx) != 1) + 1
    firsts = idx[np.r_[0, cuts]]
    lengths = np.diff(np.r_[0, cuts, len(idx)])
    base = np.zeros(1, np.int64)
    for a in range(j):
        base = (base[:, None] + np.asarray(index_sets[a], np.int64)[None, :] * strides[a]).ravel()
    starts = (base[:, None] + firsts[None, :] * strides[j]).ravel()
    stops = starts + np.tile(lengths, len(base)) * strides[j]
    return np.stack([starts, stops], axis=1)


def _touched(spec: tuple, size: int, out_lo: int, out_hi: int, k_lo: int, k_hi: int) -> np.ndarray:
    """The input indices along one axis that outputs [out_lo, out_hi) read
    at kernel positions [k_lo, k_hi) (weight indices: a reversed axis
    reads its window from the far end)."""
    window, stride, lo, _, lhs_dil, rhs_dil, reverse = spec
    k = np.arange(k_lo, k_hi)
    if reverse:
        k = window - 1 - k
    q = (np.arange(out_lo, out_hi)[:, None] * stride + k[None, :] * rhs_dil - lo).ravel()
    q = q[(q >= 0) & (q % lhs_dil == 0)] // lhs_dil
    return np.unique(q[q < size])


def _ranges(extent: int, block: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + block, extent)) for lo in range(0, extent, block)]


# -- the planned convolution -----------------------------------------------

def _planned(b: Builder, op: ir.Op, c: _Conv) -> None:
    lhs_t, out_t = op.operands[0].type, op.results[0].type
    spatial = len(c.outs)
    partials_dtype = partials_type(b.options, lhs_t.dtype, out_t.dtype)
    name = name_of(op)
    lhs_view = b.view(op.operands[0], name)
    lhs_axes = _lhs_axes(op, c)
    whole = lhs_view.is_whole_tensor
    problem = ConvProblem(
        c.groups, c.batch, c.in_chans, c.out_chans, c.in_sizes, c.window, c.outs,
        tuple(s[1] for s in c.spec), tuple((s[2], s[3]) for s in c.spec), tuple(s[4] for s in c.spec),
        tuple(s[5] for s in c.spec), np.dtype(lhs_t.dtype), partials_dtype, np.dtype(out_t.dtype),
        batch_outer_in_place=whole and _input_layout(lhs_axes, False),
        batch_inner_in_place=whole and _input_layout(lhs_axes, True))
    plan = plan_conv(b.target, problem, b.options.available_memory_proportion)
    b.flops += 2.0 * c.groups * c.batch * math.prod(c.outs) * c.out_chans * c.in_chans * math.prod(c.window)

    # The input, in a layout the AMP reads (channels innermost), copied
    # into one when it lies otherwise (as Poplar rearranges it); input-
    # channel serial steps copy their slices into that layout themselves.
    roles = ["g", "n", "c", *(("s", d) for d in range(spatial))]
    in_place = problem.batch_inner_in_place if plan.batch_inner else problem.batch_outer_in_place
    if not in_place and plan.in_serial == 1:
        wanted = _input_roles(spatial, plan.batch_inner)
        sizes = dict(_with_unit_roles(lhs_axes, roles))
        t = b.tensor(f"{name}/input", tuple(sizes[r] for r in wanted), lhs_t.dtype)
        b.copy(_view_as(lhs_view, lhs_axes, wanted), t)
        lhs_view, lhs_axes = View(t), [(r, sizes[r]) for r in wanted]
    lhs_axes = _with_unit_roles(lhs_axes, roles)
    x = _view_as(lhs_view, lhs_axes, roles)                                 # [G, N, Ci, *in]

    rhs_view = b.view(op.operands[1], name)
    rhs_axes = _rhs_axes(op, c)
    kernel_roles = ["g", *(("k", d) for d in range(spatial)), "c", "o"]
    if not rhs_view.is_whole_tensor:
        t = b.tensor(f"{name}/kernel", (c.groups, *c.window, c.in_chans, c.out_chans), rhs_view.dtype)
        b.copy(_kernel_canonical(op, rhs_view, c), t)
        rhs_view, rhs_axes = View(t), list(zip(kernel_roles, t.shape, strict=True))
    w = _view_as(rhs_view, rhs_axes, kernel_roles)                          # [G, *window, Ci, Co]

    if plan.in_serial > 1:
        lowered = _in_serial_steps(b, op, c, plan, lhs_view, lhs_axes, w, partials_dtype, out_t.dtype)
    elif plan.serial == 1:
        lowered = _partials_and_sum(b, op, c, plan, x, lhs_axes, w, rhs_axes, partials_dtype, out_t.dtype)
    else:
        lowered = _serial_steps(b, op, c, plan, x, lhs_axes, w, rhs_axes, partials_dtype, out_t.dtype)
    b.values[op.results[0]] = _as_output(b, op, c, plan, lowered)


def _serial_steps(b: Builder, op: ir.Op, c: _Conv, plan: ConvPlan, x: View, lhs_axes: list, w: View,
                  rhs_axes: list, partials_dtype: np.dtype, out_dtype: np.dtype) -> View:
    """A serially split plan: the same compute sets run once per slice of
    the output channels, on the same tiles and into the same partials, as
    poplin's serial loop does: before each step the slice of the kernel is
    copied into the step's kernel tensor, after it the step's result into a
    tensor of its own; the steps' results are then copied into the output.
    A last, smaller slice (when the channels do not divide) has compute
    sets of its own."""
    block = -(-c.out_chans // plan.serial)
    spatial = len(c.outs)
    kernel_roles = ["g", *(("k", d) for d in range(spatial)), "c", "o"]
    start = b.shared_start_tile(("conv serial", c, plan, x.tensor.mapping, tuple(lhs_axes)),
                                _vertex_count(dataclasses.replace(c, out_chans=block), plan))

    def kernel_slice(lo, hi):
        return w.then("slice", (0,) * (spatial + 2) + (lo,), (*w.shape[:-1], hi), (1,) * (spatial + 3))
    step_kernel = b.tensor(f"{name_of(op)}/kernel slice", (*w.shape[:-1], block), w.dtype)
    step_axes = list(zip(kernel_roles, step_kernel.shape, strict=True))
    parts, made = [], None
    for i, lo in enumerate(range(0, c.out_chans, block)):
        hi = min(lo + block, c.out_chans)
        label = f" serial step {i + 1} of {plan.serial}"
        if hi - lo < block:
            # The last, smaller slice: read in place, its own compute sets.
            parts.append(_partials_and_sum(b, op, dataclasses.replace(c, out_chans=hi - lo), plan, x, lhs_axes,
                                           kernel_slice(lo, hi), rhs_axes, partials_dtype, out_dtype,
                                           out_chans_at=lo, start=start, serial=label, spread=False))
            continue
        b.copy(kernel_slice(lo, hi), step_kernel)
        if made is None:
            before = len(b.steps)
            result = _partials_and_sum(b, op, dataclasses.replace(c, out_chans=block), plan, x, lhs_axes,
                                       View(step_kernel), step_axes, partials_dtype, out_dtype, start=start,
                                       serial=f" serial steps of {plan.serial}", spread=False)
            made = [step.compute_set for step in b.steps[before:]]
        else:
            for compute_set in made:
                b.rerun(compute_set)
        kept = b.tensor(f"{name_of(op)}/step {i + 1}", result.tensor.shape, out_dtype, result.tensor.mapping)
        b.copy(View(result.tensor), kept)
        parts.append(View(kept).then("reshape", result.shape))
    shape = (*parts[0].shape[:-1], c.out_chans)
    out = b.tensor(f"{name_of(op)}/steps", shape, out_dtype)
    b.copy(Concat(tuple(parts), len(shape) - 1), out)
    return View(out)


def _in_serial_steps(b: Builder, op: ir.Op, c: _Conv, plan: ConvPlan, lhs_view: View, lhs_axes: list, w: View,
                     partials_dtype: np.dtype, out_dtype: np.dtype) -> View:
    """An input-channel serially split plan, as poplin's loop over
    inChanSplit.serial runs it: before each step the step's slice of the
    input channels is copied into a tensor in the AMP's layout and the
    kernel's into the step's kernel tensor; the step's compute sets (run
    once, rerun after) make the sum of its partials in the partials' type,
    which the first step copies into the accumulator and every later step
    adds into it (a compute set of its own, rerun); after the last, the
    accumulator is cast to the output's type. A last, smaller slice (when
    the channels do not divide) has compute sets of its own, its
    input-channel tiles the most that divide its channels."""
    block = -(-c.in_chans // plan.in_serial)
    spatial = len(c.outs)
    wanted = _input_roles(spatial, plan.batch_inner)
    sizes = dict(lhs_axes)
    source = _view_as(lhs_view, lhs_axes, wanted)                       # [.., Ci] in the AMP's layout
    kernel_roles = ["g", *(("k", d) for d in range(spatial)), "c", "o"]
    step_c = dataclasses.replace(c, in_chans=block)
    start = b.shared_start_tile(("conv in-serial", c, plan, lhs_view.tensor.mapping, tuple(lhs_axes)),
                                _vertex_count(step_c, plan))
    name = name_of(op)

    def sliced(view: View, axis: int, lo: int, hi: int) -> View:
        shape = view.shape
        return view.then("slice", tuple(lo if a == axis else 0 for a in range(len(shape))),
                         tuple(hi if a == axis else n for a, n in enumerate(shape)), (1,) * len(shape))

    def step_tensors(width: int, label: str):
        x_t = b.tensor(f"{name}/input slice{label}", (*source.shape[:-1], width), source.dtype)
        w_t = b.tensor(f"{name}/kernel slice{label}", (*w.shape[:-2], width, w.shape[-1]), w.dtype)
        x_axes = [(r, width if r == "c" else sizes.get(r, 1)) for r in wanted]
        return x_t, w_t, x_axes, list(zip(kernel_roles, w_t.shape, strict=True))

    def copy_in(lo: int, hi: int, x_t, w_t, x_axes: list) -> View:
        """The step's slices copied into its tensors; its input as the
        partials' lowering reads it."""
        b.copy(sliced(source, len(wanted) - 1, lo, hi), x_t)
        b.copy(sliced(w, spatial + 1, lo, hi), w_t)
        return _view_as(View(x_t), x_axes, ["g", "n", "c", *(("s", d) for d in range(spatial))])

    def accumulate(result: View, kept: dict) -> None:
        if "acc" not in kept:
            kept["acc"] = b.tensor(f"{name}/accumulated", result.tensor.shape, partials_dtype,
                                   result.tensor.mapping)
            b.copy(View(result.tensor), kept["acc"])
            return
        acc = kept["acc"]
        if kept.get("add_of") is result.tensor:
            b.rerun(kept["add"])
            return
        # (A last, smaller slice's sum may have another shape: [chunks, ...] or flat.)
        step = View(result.tensor) if result.tensor.shape == acc.shape else \
            View(result.tensor).then("reshape", acc.shape)
        kernel = codelets.ElementwiseChain((View(acc), step), (codelets.Instruction("add", (0, 1), partials_dtype),),
                                           ((2, acc),), acc.shape)
        vertices = b.vertices_over(f"ElementwiseChain<{partials_dtype.name}>[add]", [acc], [View(acc), step],
                                   lambda n: cost.elementwise_cycles(b.target, n, partials_dtype, ["add"]))
        step = b.execute(f"conv serial accumulate {name}", kernel, vertices)
        kept.update(add=step.compute_set, add_of=result.tensor)

    kept, made, result = {}, None, None
    x_t = w_t = None
    for i, lo in enumerate(range(0, c.in_chans, block)):
        hi = min(lo + block, c.in_chans)
        label = f" serial step {i + 1} of {plan.in_serial} over input channels"
        if hi - lo < block:
            # The last, smaller slice: its own tensors and compute sets.
            tiles = max(d for d in range(1, plan.in_chans[0] + 1) if (hi - lo) % d == 0)
            last = dataclasses.replace(plan, in_chans=(tiles, (hi - lo) // tiles))
            lx, lw, lx_axes, lw_axes = step_tensors(hi - lo, " (last)")
            x = copy_in(lo, hi, lx, lw, lx_axes)
            last_result = _partials_and_sum(b, op, dataclasses.replace(c, in_chans=hi - lo), last, x, lx_axes,
                                            View(lw), lw_axes, partials_dtype, partials_dtype, start=start,
                                            serial=label, spread=False)
            accumulate(last_result, kept)
            continue
        if x_t is None:
            x_t, w_t, x_axes, w_axes = step_tensors(block, "")
        x = copy_in(lo, hi, x_t, w_t, x_axes)
        if made is None:
            before = len(b.steps)
            result = _partials_and_sum(b, op, step_c, plan, x, x_axes, View(w_t), w_axes, partials_dtype,
                                       partials_dtype, start=start,
                                       serial=f" serial steps of {plan.in_serial} over input channels", spread=False)
            made = [step.compute_set for step in b.steps[before:]]
        else:
            for compute_set in made:
                b.rerun(compute_set)
        accumulate(result, kept)
    acc = kept["acc"]
    shape = result.shape
    size = acc.size
    if partials_dtype == out_dtype and acc.mapping.same_runs(b.linear_mapping(size, out_dtype)):
        return View(acc).then("reshape", shape)
    out = b.tensor(name, (size,), out_dtype)
    if partials_dtype == out_dtype:
        b.copy(View(acc).then("reshape", (size,)), out)
    else:
        reduce_partials(b, op, View(acc).then("reshape", (1, size)), out, "conv cast",
                        _reduce_cycles(b, partials_dtype, out_dtype))
    return View(out).then("reshape", shape)


def _reduce_cycles(b: Builder, partials_dtype: np.dtype, out_dtype: np.dtype):
    """cycles(elements, partials each) of a tile's sum of a convolution's
    partials into its output's type."""
    out_float, partials_float = np.dtype(out_dtype).itemsize == 4, partials_dtype.itemsize == 4
    if partials_dtype.kind == "f":
        return lambda n, count: cost_conv.reduce_cycles(b.target, n, count, out_float, partials_float)
    return lambda n, count: cost.reduce_cycles(b.target, n * count, partials_dtype)


def _kernel_canonical(op: ir.Op, rhs_view: View, c: _Conv) -> View:
    """The kernel operand (any view) as [G, *window, Ci, Co]."""
    dn = op.attrs["dimension_numbers"]
    spatial = len(c.window)
    v = rhs_view.then("transpose", (dn.kernel_output_feature_dimension, *dn.kernel_spatial_dimensions,
                                    dn.kernel_input_feature_dimension))
    v = v.then("reshape", (c.groups, c.out_chans, *c.window, c.in_chans))
    return v.then("transpose", (0, *range(2, 2 + spatial), 2 + spatial, 1))


def _output_roles(spatial: int, batch_inner: bool) -> list:
    field = [("s", d) for d in range(spatial)]
    return ["g", *field, "n", "o"] if batch_inner else ["g", "n", *field, "o"]


def _partials_and_sum(b: Builder, op: ir.Op, c: _Conv, plan: ConvPlan, x: View, lhs_axes: list, w: View,
                      rhs_axes: list, partials_dtype: np.dtype, out_dtype: np.dtype, out_chans_at: int = 0,
                      start: int | None = None, serial: str = "", spread: bool = True) -> View:
    """The ConvPartials compute set, then the sum of its chunks (and the
    cast to the output's type) where there is one: the convolution's
    result [G, N, *outs, Co] ([G, *outs, N, Co] batch inner). A serial
    step's `w` is a slice of the kernel's output channels, from
    `out_chans_at` of the kernel tensor (laid out as `rhs_axes`), on the
    tiles from `start`, `serial` naming it in the compute sets, and its
    result left where its vertices put it unless `spread`."""
    spatial = len(c.outs)
    chunks = plan.chunks
    roles = _output_roles(spatial, plan.batch_inner)
    sizes = {"g": c.groups, "n": c.batch, "o": c.out_chans, **{("s", d): c.outs[d] for d in range(spatial)}}
    shape = (chunks, *(sizes[r] for r in roles))
    codelet = f"ConvPartial{'1x1Out' if plan.vertex == '1x1' else 'nx1'}<{x.dtype.name},{partials_dtype.name}>"
    key = ("conv", codelet, c, plan, x.tensor.mapping, tuple(lhs_axes), w.tensor.mapping, tuple(rhs_axes),
           out_chans_at)
    if start is None:
        start = b.shared_start_tile(key, _vertex_count(c, plan))
    mapping, tiles, cycles, in_iv, in_at, w_iv, w_at, out_iv, out_at, in_rows = b.pattern(
        (*key, start), lambda: _vertices(b, c, plan, lhs_axes, rhs_axes, shape, roles, start, x.dtype,
                                         partials_dtype, out_chans_at))
    partials = b.tensor(f"{name_of(op)}/partials", shape, partials_dtype, mapping)
    kernel = ConvPartials(x, w, partials, c.spec, plan.in_chans[0], tuple(s for s, _ in plan.window),
                          plan.batch_inner)
    vertices = VertexArray(codelet, tiles, cycles, ((x.tensor, in_iv, in_at), (w.tensor, w_iv, w_at)),
                           ((partials, out_iv, out_at),), (in_rows,))
    split = "x".join(str(s) for s, _ in (plan.groups, plan.batch, *plan.outs, plan.in_chans, plan.out_chans,
                                          *plan.window))
    b.execute(f"conv {name_of(op)} {split} tiles{' batch-inner' if plan.batch_inner else ''}{serial}", kernel,
              vertices)
    size = int(np.prod(shape[1:], dtype=np.int64))
    if chunks == 1 and partials_dtype == out_dtype:
        if not spread or partials.mapping.same_runs(b.linear_mapping(size, out_dtype)):
            return View(partials).then("reshape", shape[1:])
        # The partials are the result, on the tiles of the vertices that
        # wrote them (a plan on fewer tiles leaves more on each): spread
        # once, as a reduction would have spread them, rather than have
        # every element-wise reader (mapped linearly) receive them again.
        out = b.tensor(name_of(op), (size,), out_dtype)
        b.copy(View(partials).then("reshape", (size,)), out)
        return View(out).then("reshape", shape[1:])
    out = b.tensor(name_of(op), (size,), out_dtype)
    reduce_partials(b, op, View(partials).then("reshape", (chunks, size)), out, "conv reduce",
                    _reduce_cycles(b, partials_dtype, out_dtype))
    return View(out).then("reshape", shape[1:])



def _block_ranges(c: _Conv, plan: ConvPlan) -> list:
    """Per grid axis (input channels, kernel dimensions, groups, batch,
    output dimensions, output channels: a vertex's chunk first) its
    blocks' (lo, hi)."""
    return [_ranges(c.in_chans, plan.in_chans[1]),
            *(_ranges(wd, blk) for wd, (_, blk) in zip(c.window, plan.window, strict=True)),
            _ranges(c.groups, plan.groups[1]), _ranges(c.batch, plan.batch[1]),
            *(_ranges(od, blk) for od, (_, blk) in zip(c.outs, plan.outs, strict=True)),
            _ranges(c.out_chans, plan.out_chans[1])]


def _vertex_count(c: _Conv, plan: ConvPlan) -> int:
    return math.prod(len(r) for r in _block_ranges(c, plan))


def rect_intervals(sizes, lows: np.ndarray, highs: np.ndarray, with_rows: bool = False) -> tuple:
    """The flat (C order) intervals of boxes [lows[i], highs[i]) (per axis)
    of an array of `sizes`: (intervals [k, 2], offsets [boxes + 1], box i's
    intervals[offsets[i]:offsets[i + 1]]). A box is a run per index of its
    outer axes, along the innermost axis it does not fill. Boxes of one
    shape are worked out together (a plan's blocks take a few shapes).
    with_rows: also the same intervals as Rows whose `vertex` is the box
    (a group per index of the axes outside the runs' next axis, which
    steps the rows)."""
    sizes = np.asarray(sizes, np.int64)
    strides = np.cumprod(np.r_[1, sizes[::-1]])[:-1][::-1]
    lengths = highs - lows
    boxes = len(lows)
    # (Shapes as one number each, in the same order: np.unique over rows sorts them as records, slowly.)
    keys, which = np.unique(np.ravel_multi_index(lengths.T, sizes + 1), return_inverse=True)
    shapes = np.stack(np.unravel_index(keys, sizes + 1), axis=1) if len(sizes) else np.zeros((len(keys), 0), np.int64)
    which = which.ravel()
    counts = np.zeros(boxes, np.int64)
    made = []
    rows = []          # (box, base, width, stride, count) per group of rows
    for s, shape in enumerate(shapes):
        members = np.flatnonzero(which == s)
        if (shape == 0).any():
            made.append((members, np.zeros((len(members), 0), np.int64), 0))
            continue
        j = len(sizes) - 1
        while j >= 0 and shape[j] == sizes[j]:
            j -= 1
        if j < 0:
            whole = int(np.prod(sizes))
            made.append((members, np.zeros((len(members), 1), np.int64), whole))
            counts[members] = 1
            rows.append((members, np.zeros(len(members), np.int64), whole, whole, 1))
            continue
        combos = np.zeros(1, np.int64)
        for a in range(j):
            if with_rows and a == j - 1:
                outer = combos
            combos = (combos[:, None] + np.arange(shape[a]) * strides[a]).ravel()
        base = (lows[members, :j + 1] * strides[:j + 1]).sum(axis=1)
        width = int(shape[j] * strides[j])
        made.append((members, base[:, None] + combos[None, :], width))
        counts[members] = len(combos)
        if with_rows:
            outer = combos if j == 0 else outer
            step, steps = (int(strides[j - 1]), int(shape[j - 1])) if j else (width, 1)
            rows.append((np.repeat(members, len(outer)), (base[:, None] + outer[None, :]).ravel(), width, step, steps))
    offsets = np.r_[0, np.cumsum(counts)]
    # int32 where every position fits, as compact() would make them.
    dtype = np.int32 if int(np.prod(sizes)) < 2 ** 31 else np.int64
    if with_rows:
        return (*_rect_intervals(made, offsets, dtype), _as_rows(rows))
    return _rect_intervals(made, offsets, dtype)


def _as_rows(parts: list) -> Rows:
    """Rows from (boxes, bases, width, stride, count) per box shape."""
    if not parts:
        empty = np.zeros(0, np.int64)
        return Rows(empty, empty, empty, empty, empty)
    box = np.concatenate([p[0] for p in parts])
    return Rows(box, np.concatenate([p[1] for p in parts]),
                *(np.concatenate([np.full(len(p[0]), p[k], np.int64) for p in parts]) for k in (2, 3, 4)))


def _rect_intervals(made: list, offsets: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """rect_intervals' intervals from the boxes' run starts per shape,
    written in place (a convolution's partials have millions of runs)."""
    intervals = np.zeros((int(offsets[-1]), 2), dtype)
    if len(made) == 1 and made[0][1].shape[1]:     # boxes of one shape (members in order): no scatter
        np.copyto(intervals[:, 0], made[0][1].ravel(), casting="unsafe")
        np.add(intervals[:, 0], made[0][2], out=intervals[:, 1], casting="unsafe")
        return intervals, offsets
    for members, starts, length in made:
        if starts.shape[1] == 0:
            continue
        at = (offsets[members][:, None] + np.arange(starts.shape[1])[None, :]).ravel()
        intervals[at, 0] = starts.ravel()
        intervals[at, 1] = starts.ravel() + length
    return intervals, offsets


def _vertices(b: Builder, c: _Conv, plan: ConvPlan, lhs_axes: list, rhs_axes: list, shape: tuple, roles: list,
              start: int, in_dtype: np.dtype, partials_dtype: np.dtype, out_chans_at: int = 0) -> tuple:
    """(the partials' mapping, and the vertices as arrays: tiles, cycles,
    input region intervals and each vertex's range of them, kernel block
    intervals and ranges, partials intervals and offsets). Vertices that
    differ only in output channels read one input region, and those that
    differ only in batch and field one kernel block: each is listed once."""
    spatial = len(c.outs)
    grid = _block_ranges(c, plan)
    counts = [len(r) for r in grid]
    vertices = math.prod(counts)
    index = np.stack(np.unravel_index(np.arange(vertices), counts), axis=1)     # [V, axes]
    # Per grid axis, each vertex's block: lo and hi.
    lo = np.stack([np.array([r[0] for r in grid[a]])[index[:, a]] for a in range(len(grid))], axis=1)
    hi = np.stack([np.array([r[1] for r in grid[a]])[index[:, a]] for a in range(len(grid))], axis=1)
    ci_at, k_at, g_at, n_at = 0, 1, 1 + spatial, 2 + spatial
    o_at, co_at = 3 + spatial, 3 + 2 * spatial

    def box(axes: list, bounds: dict, rows) -> tuple[np.ndarray, np.ndarray]:
        """Per row of `rows` (vertices), the (lows, highs) of a tensor laid
        out as `axes` (role, size), from bounds[role] = (lo, hi) arrays."""
        lows = np.stack([bounds[r][0][rows] if r in bounds else np.zeros(len(rows), np.int64) for r, _ in axes], 1)
        highs = np.stack([bounds[r][1][rows] if r in bounds else np.ones(len(rows), np.int64) for r, _ in axes], 1)
        return lows, highs

    def shared(key_axes, intervals_of):
        """Intervals of each distinct key (the vertex's blocks along
        key_axes), each vertex's [start, stop) among them, and the same as
        SharedRows if intervals_of gives Rows (else None)."""
        # (Keys as one number each: np.unique over rows sorts them as records, slowly.)
        keys = np.ravel_multi_index(index[:, key_axes].T, [counts[a] for a in key_axes])
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        intervals, offsets, *rows = intervals_of(first)
        inverse = inverse.ravel()
        regions = SharedRows(rows[0], inverse) if rows and rows[0] is not None else None
        return intervals, np.stack([offsets[inverse], offsets[inverse + 1]], axis=1), regions

    def input_regions(rows):
        bounds = {"g": (lo[:, g_at], hi[:, g_at]), "n": (lo[:, n_at], hi[:, n_at]),
                  "c": (lo[:, ci_at], hi[:, ci_at])}
        touched = []
        for d in range(spatial):     # (once per distinct output and kernel block: a few per axis)
            blocks = {}
            touched.append([blocks[key] if key in blocks else blocks.setdefault(
                key, _touched(c.spec[d], c.in_sizes[d], *key))
                for key in zip(lo[rows, o_at + d].tolist(), hi[rows, o_at + d].tolist(),
                               lo[rows, k_at + d].tolist(), hi[rows, k_at + d].tolist(), strict=True)])
        if all(len(t) == 0 or t[-1] - t[0] + 1 == len(t) for per in touched for t in per):
            # Each region a box (a contiguous run of input along each axis).
            for d in range(spatial):
                first = np.array([t[0] if len(t) else 0 for t in touched[d]], np.int64)
                size = np.array([len(t) for t in touched[d]], np.int64)
                full_lo, full_hi = np.zeros(vertices, np.int64), np.zeros(vertices, np.int64)
                full_lo[rows], full_hi[rows] = first, first + size
                bounds[("s", d)] = (full_lo, full_hi)
            return rect_intervals([s for _, s in lhs_axes], *box(lhs_axes, bounds, rows), with_rows=True)
        parts = []
        for i, v in enumerate(rows):
            sets = {r: np.arange(bounds[r][0][v], bounds[r][1][v]) for r in ("g", "n", "c")}
            sets.update({("s", d): touched[d][i] for d in range(spatial)})
            parts.append(block_intervals([s for _, s in lhs_axes], [sets.get(r, np.zeros(1, np.int64))
                                                                     for r, _ in lhs_axes]))
        return np.concatenate(parts), np.r_[0, np.cumsum([len(p) for p in parts])], None

    def kernel_blocks(rows):
        bounds = {"g": (lo[:, g_at], hi[:, g_at]), "c": (lo[:, ci_at], hi[:, ci_at]),
                  "o": (lo[:, co_at] + out_chans_at, hi[:, co_at] + out_chans_at),
                  **{("k", d): (lo[:, k_at + d], hi[:, k_at + d]) for d in range(spatial)}}
        return rect_intervals([s for _, s in rhs_axes], *box(rhs_axes, bounds, rows))

    in_iv, in_at, in_rows = shared([ci_at, *range(k_at, k_at + spatial), g_at, n_at, *range(o_at, o_at + spatial)],
                                   input_regions)
    w_iv, w_at, _ = shared([ci_at, *range(k_at, k_at + spatial), g_at, co_at], kernel_blocks)
    # Partials: chunk (input-channel block, kernel blocks), then the output block.
    chunk = index[:, ci_at] * math.prod(counts[k_at:k_at + spatial]) + (
        np.ravel_multi_index(index[:, k_at:k_at + spatial].T, counts[k_at:k_at + spatial]) if spatial else 0)
    bounds = {"chunk": (chunk, chunk + 1), "g": (lo[:, g_at], hi[:, g_at]), "n": (lo[:, n_at], hi[:, n_at]),
              "o": (lo[:, co_at], hi[:, co_at]), **{("s", d): (lo[:, o_at + d], hi[:, o_at + d]) for d in range(spatial)}}
    out_axes = [("chunk", shape[0]), *((r, s) for r, s in zip(roles, shape[1:], strict=True))]
    out_iv, out_at = rect_intervals(shape, *box(out_axes, bounds, np.arange(vertices)))
    tiles = (start + np.arange(vertices)) % b.target.num_tiles
    owner = np.repeat(tiles, np.diff(out_at))
    order = np.argsort(out_iv[:, 0], kind="stable")
    mapping = TileMapping.from_runs(int(np.prod(shape, dtype=np.int64)), owner[order], out_iv[order, 0])
    sizes = hi - lo
    cycles = vertex_cycles(b.target, c, plan, in_dtype, partials_dtype, sizes[:, g_at], sizes[:, n_at],
                           [sizes[:, o_at + d] for d in range(spatial)], sizes[:, ci_at], sizes[:, co_at],
                           [sizes[:, k_at + d] for d in range(spatial)])
    return (mapping, tiles, np.asarray(cycles, np.int64), compact(in_iv), in_at, compact(w_iv), w_at,
            compact(out_iv), out_at, in_rows)


def vertex_cycles(target, c: _Conv, plan: ConvPlan, in_dtype, partials_dtype, g_b, n_b, o_b, ci_b, co_b, k_b):
    """Each vertex's cycles, from its blocks' sizes (arrays)."""
    return compute_cycles(target, plan.vertex, plan.in_group, plan.batch_inner, in_dtype, partials_dtype,
                          tuple(s[1] for s in c.spec), tuple(s[4] for s in c.spec), g_b, n_b, o_b, ci_b, co_b, k_b)


def _as_output(b: Builder, op: ir.Op, c: _Conv, plan: ConvPlan, lowered: View) -> View:
    """The result laid out as the op's output: a view when the output's
    dimension order walks it in order, else a Copy."""
    dn = op.attrs["dimension_numbers"]
    out_t = op.results[0].type
    spatial = len(c.outs)
    roles = _output_roles(spatial, plan.batch_inner)
    sizes = {"g": c.groups, "n": c.batch, "o": c.out_chans, **{("s", d): c.outs[d] for d in range(spatial)}}
    axes = []
    for a in range(len(out_t.shape)):
        if a == dn.output_batch_dimension:
            axes.append("n")
        elif a == dn.output_feature_dimension:
            axes += ["g", "o"]
        else:
            axes.append(("s", dn.output_spatial_dimensions.index(a)))
    view = lowered.then("reshape", tuple(sizes[r] for r in roles))
    if [r for r in roles if sizes[r] > 1] == [r for r in axes if sizes[r] > 1]:
        return view.then("reshape", tuple(out_t.shape))
    moved = view.then("transpose", tuple(roles.index(r) for r in axes)).then("reshape", tuple(out_t.shape))
    return copy_to_new(b, op, moved)
