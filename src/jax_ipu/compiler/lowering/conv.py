"""convolution, planned as Poplar plans it: as a matmul. The input is
rearranged into im2col patches [groups, batch x output positions, input
features x window] by one Copy (padding, lhs and rhs dilation, strides and
window reversal resolved at compile time into the Copy's source indices),
the kernel into [groups, input features x window, output features], and the
planned matmul (compiler.matmul: tile mapping, K-split partials, cost)
multiplies them; a last Copy lays the product out in the output's
dimension order. Groups (feature_group_count or batch_group_count) are the
matmul's batch dimension, as the StableHLO spec splits them."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.lowering import matmul
from jax_ipu.compiler.builder import Builder, Splat
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.compiler.lowering.layout import copy_to_new, name_of
from jax_ipu.compiler.planners.windows import attr, axis_windows, combine, out_size, padding, row_major_strides
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.ir import DotDimensionNumbers


def _expand(index: np.ndarray, axes: list[int], rank: int) -> np.ndarray:
    """`index` (one axis per entry of `axes`) placed on those axes of a
    rank-`rank` broadcastable array."""
    shape = [1] * rank
    for i, a in enumerate(axes):
        shape[a] = index.shape[i]
    return index.reshape(shape)


def _gathered(b: Builder, op: ir.Op, value: ir.Value, indices: np.ndarray, fill) -> ir.Value:
    """A new IR value holding value's elements at `indices` (a Copy)."""
    source = b.view(value, name_of(op))
    out = copy_to_new(b, op, source.then("gather", np.ascontiguousarray(indices), fill))
    result = ir.Value(ir.TensorType(tuple(indices.shape), value.type.dtype))
    b.values[result] = out
    return result


@register("convolution")
def convolution(b: Builder, op: ir.Op) -> None:
    lhs, rhs = op.operands
    lhs_t, rhs_t, out_t = lhs.type, rhs.type, op.results[0].type
    if lhs_t.dtype != rhs_t.dtype or lhs_t.dtype.kind not in "fiu":
        raise IpuUnimplementedError.for_op(
            op, f"convolution of {lhs_t} and {rhs_t} is not supported",
            "Use numeric operands of one type, or file an issue")
    dn = op.attrs["dimension_numbers"]
    spatial = len(dn.input_spatial_dimensions)
    strides = attr(op, "window_strides", spatial, 1)
    lhs_dilation = attr(op, "lhs_dilation", spatial, 1)
    rhs_dilation = attr(op, "rhs_dilation", spatial, 1)
    pads = padding(op, spatial)
    reversal = tuple(bool(r) for r in (op.attrs.get("window_reversal") or (False,) * spatial))
    groups_f = int(op.attrs.get("feature_group_count") or 1)
    groups_b = int(op.attrs.get("batch_group_count") or 1)
    groups = max(groups_f, groups_b)

    n = lhs_t.shape[dn.input_batch_dimension]
    o = rhs_t.shape[dn.kernel_output_feature_dimension]
    cg = rhs_t.shape[dn.kernel_input_feature_dimension]     # input features per group
    nb, og = n // groups_b, o // groups                      # batch per group, outputs per group
    window = [rhs_t.shape[d] for d in dn.kernel_spatial_dimensions]
    in_sizes = [lhs_t.shape[d] for d in dn.input_spatial_dimensions]
    outs = [out_t.shape[d] for d in dn.output_spatial_dimensions]
    for d in range(spatial):
        expected = out_size(in_sizes[d], window[d], strides[d], pads[d], lhs_dilation[d], rhs_dilation[d])
        if expected != outs[d]:
            raise IpuUnimplementedError.for_op(op, f"output size {outs[d]} of spatial dimension {d} "
                                                   f"differs from the computed {expected}", "Please report it")
    positions = int(np.prod(outs, dtype=np.int64))
    taps = int(np.prod(window, dtype=np.int64))
    m, k = nb * positions, cg * taps
    out_dtype = out_t.dtype
    if out_t.size == 0 or lhs_t.size == 0 or rhs_t.size == 0:
        # Nothing to read (an empty input: the output is all padding): zeros.
        b.values[op.results[0]] = Splat(np.zeros((), out_dtype), out_t.shape)
        return

    # Patches [groups, nb, *outs, cg, *window] -> [groups, m, k].
    rank = 3 + 2 * spatial
    g_ax, n_ax, c_ax = 0, 1, 2 + spatial
    o_axes = list(range(2, 2 + spatial))
    w_axes = list(range(3 + spatial, rank))
    lhs_strides = row_major_strides(lhs_t.shape)
    group = np.arange(groups)
    batch_index = _expand(np.arange(nb), [n_ax], rank) + (
        _expand(group * nb, [g_ax], rank) if groups_b > 1 else 0)
    feature_index = _expand(np.arange(cg), [c_ax], rank) + (
        _expand(group * cg, [g_ax], rank) if groups_f > 1 else 0)
    per_axis = [batch_index, feature_index]
    axis_strides = [lhs_strides[dn.input_batch_dimension], lhs_strides[dn.input_feature_dimension]]
    for d in range(spatial):
        idx = axis_windows(in_sizes[d], window[d], strides[d], pads[d], lhs_dilation[d], rhs_dilation[d],
                           outs[d], reversal[d])
        per_axis.append(_expand(idx, [o_axes[d], w_axes[d]], rank))
        axis_strides.append(lhs_strides[dn.input_spatial_dimensions[d]])
    full = (groups, nb, *outs, cg, *window)
    patches_index = np.broadcast_to(combine(per_axis, axis_strides, narrow=True), full).reshape(groups, m, k)
    patches = _gathered(b, op, lhs, patches_index, np.zeros((), lhs_t.dtype))

    # Kernel [groups, cg, *window, og] -> [groups, k, og].
    rhs_strides = row_major_strides(rhs_t.shape)
    krank = 3 + spatial
    kernel_axes = [_expand(np.arange(cg), [1], krank),
                   _expand(group, [0], krank) * og + _expand(np.arange(og), [krank - 1], krank)]
    kernel_axes += [_expand(np.arange(window[d]), [2 + d], krank) for d in range(spatial)]
    kernel_strides = [rhs_strides[dn.kernel_input_feature_dimension], rhs_strides[dn.kernel_output_feature_dimension]]
    kernel_strides += [rhs_strides[dn.kernel_spatial_dimensions[d]] for d in range(spatial)]
    # Summed smallest parts first, in int32 where it fits (a weight
    # gradient's "kernel" is the output gradient: millions of elements).
    kernel_index = np.broadcast_to(combine(kernel_axes, kernel_strides, narrow=True),
                                   (groups, cg, *window, og)).reshape(groups, k, og)
    kernel = _gathered(b, op, rhs, kernel_index, None)

    # The planned matmul [groups, m, k] x [groups, k, og] -> [groups, m, og].
    product = ir.Value(ir.TensorType((groups, m, og), out_dtype))
    dot = ir.Op("convolution", [patches, kernel], [product],
                {"dot_dimension_numbers": DotDimensionNumbers((0,), (0,), (2,), (1,))}, [], op.loc)
    matmul.dot_general(b, dot)
    lowered = b.values[product]
    if isinstance(lowered, Splat):
        b.values[op.results[0]] = Splat(lowered.value, out_t.shape)
        return

    # Output element (batch, feature, *positions) <- product[group, (nb, *positions), og].
    orank = len(out_t.shape)
    ob = _expand(np.arange(out_t.shape[dn.output_batch_dimension]), [dn.output_batch_dimension], orank)
    of = _expand(np.arange(o), [dn.output_feature_dimension], orank)
    flat = (of // og) * (m * og) + (of % og) + ob * (positions * og)
    position_strides = row_major_strides(outs)
    for d in range(spatial):
        axis = dn.output_spatial_dimensions[d]
        flat = flat + _expand(np.arange(outs[d]), [axis], orank) * (position_strides[d] * og)
    out_index = np.broadcast_to(flat, out_t.shape)
    if np.array_equal(out_index.ravel(), np.arange(out_t.size)):
        b.values[op.results[0]] = lowered.then("reshape", out_t.shape)
    else:
        b.values[op.results[0]] = copy_to_new(b, op, lowered.then("gather", np.ascontiguousarray(out_index), None))
