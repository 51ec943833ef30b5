"""A convolution as an im2col matmul: what a convolution the planned
path (lowering/conv.py) does not take falls back to. The input is
rearranged into im2col patches [groups, batch x output positions, window
x input features] by one Copy of a "windows" view (padding, lhs and rhs
dilation, strides and window reversal as a pattern over the spatial axes,
not an index per element), the kernel into [groups, window x input
features, output features], and the planned matmul (compiler.matmul: tile
mapping, K-split partials, cost) multiplies them; a last Copy lays the
product out in the output's dimension order when that is not a reshape. Groups (feature_group_count or batch_group_count) are the
matmul's batch dimension, as the StableHLO spec splits them."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.builder import Builder, Splat
from jax_ipu.compiler.lowering import matmul
from jax_ipu.compiler.lowering.layout import copy_to_new, name_of
from jax_ipu.graph.views import View
from jax_ipu.ir import DotDimensionNumbers


def _values(b: Builder, view: View) -> ir.Value:
    """A new IR value holding the view's elements (a Copy)."""
    result = ir.Value(ir.TensorType(tuple(view.shape), view.dtype))
    b.values[result] = view
    return result


def convolution(b: Builder, op: ir.Op, c, reason: str) -> None:
    """The convolution as patches times the kernel; `c`: what
    lowering/conv.py read off the op (its attributes per spatial dimension
    in `c.spec`, sizes checked, operands checked and not empty); `reason`
    (why the planned path did not take it) names its steps."""
    lhs, rhs = op.operands
    lhs_t, out_t = lhs.type, op.results[0].type
    dn = op.attrs["dimension_numbers"]
    spatial = len(c.spec)
    groups, groups_b, groups_f = c.groups, c.batch_groups, c.feature_groups
    nb, cg, og = c.batch, c.in_chans, c.out_chans     # batch, input and output features per group
    window, in_sizes, outs, spec = c.window, c.in_sizes, c.outs, c.spec
    positions = int(np.prod(outs, dtype=np.int64))
    taps = int(np.prod(window, dtype=np.int64))
    m, k = nb * positions, cg * taps
    out_dtype = out_t.dtype

    # Patches [groups, rows, *window, cg] -> [groups, m, k], rows
    # (nb, *outs) or (*outs, nb): the input as [groups, nb, cg, *sizes], its
    # spatial axes read as windows (a pattern: no index per element), one
    # Copy. The contraction runs over window positions, then input
    # features, as Poplar's convolution vertices take them (input channels
    # in groups at each kernel position): a patch row is then runs of whole
    # feature vectors of a channels-last input, and an HWIO kernel is
    # [k, og] as it stands. The rows come in the order the output's
    # dimensions walk them, when one does (a weight gradient's [*window,
    # in, out] output is then the product as it stands, not a Copy).
    name = name_of(op)
    canonical = (dn.output_batch_dimension, dn.output_feature_dimension, *dn.output_spatial_dimensions)
    order = tuple(int(a) for a in np.argsort(canonical))
    batch_first = _walks_in_order(order, spatial, outs, nb, og, groups, False)
    outs_first = not batch_first and _walks_in_order(order, spatial, outs, nb, og, groups, True)
    lhs_view = b.view(lhs, name).then("transpose", (dn.input_batch_dimension, dn.input_feature_dimension,
                                                    *dn.input_spatial_dimensions))
    lhs_view = lhs_view.then("reshape", (groups_b, nb, groups_f, cg, *in_sizes)).then(
        "transpose", (0, 2, 1, 3, *range(4, 4 + spatial))).then("reshape", (groups, nb, cg, *in_sizes))
    fill = np.zeros((), lhs_t.dtype) if any(lo > 0 or hi > 0 or base > 1 for _, _, lo, hi, base, _, _ in spec) else None
    rows = (*range(3, 3 + spatial), 1) if outs_first else (1, *range(3, 3 + spatial))
    patches_view = lhs_view.then("windows", spec, fill).then(
        "transpose", (0, *rows, *range(3 + spatial, 3 + 2 * spatial), 2)).then(
        "reshape", (groups, m, k))
    patches = _values(b, copy_to_new(b, op, patches_view))

    # Kernel [groups, *window, cg, og] -> [groups, k, og].
    hwio = (*dn.kernel_spatial_dimensions, dn.kernel_input_feature_dimension, dn.kernel_output_feature_dimension)
    if groups == 1 and hwio == tuple(range(len(hwio))):
        # The kernel lies as the product reads it: read in place, as a
        # dense layer's weights are, not copied first.
        kernel = _values(b, b.view(rhs, name).then("reshape", (1, k, og)))
    else:
        kernel_view = b.view(rhs, name).then("transpose", (dn.kernel_output_feature_dimension,
                                                           dn.kernel_input_feature_dimension,
                                                           *dn.kernel_spatial_dimensions))
        kernel_view = kernel_view.then("reshape", (groups, og, cg, *window)).then(
            "transpose", (0, *range(3, 3 + spatial), 2, 1)).then("reshape", (groups, k, og))
        kernel = _values(b, copy_to_new(b, op, kernel_view))

    # The planned matmul [groups, m, k] x [groups, k, og] -> [groups, m, og].
    product = ir.Value(ir.TensorType((groups, m, og), out_dtype))
    dot = ir.Op(f"convolution (im2col: {reason})", [patches, kernel], [product],
                {"dot_dimension_numbers": DotDimensionNumbers((0,), (0,), (2,), (1,))}, [], op.loc)
    matmul.dot_general(b, dot)
    lowered = b.values[product]
    if isinstance(lowered, Splat):
        b.values[op.results[0]] = Splat(lowered.value, out_t.shape)
        return

    # Output (batch, feature, *positions) <- product[group, rows, feature in group]:
    # [groups, *rows, og] as [nb, groups x og, *outs] in the output's dimension order.
    if batch_first or outs_first:
        b.values[op.results[0]] = lowered.then("reshape", out_t.shape)
        return
    sizes, walks = _product_axes(spatial, outs, nb, og, groups, outs_first)
    at_nb, at_outs = walks[0][0], [walks[2 + d][0] for d in range(spatial)]
    out_view = lowered.then("reshape", sizes).then("transpose", (at_nb, 0, 2 + spatial, *at_outs)).then(
        "reshape", (nb, groups * og, *outs)).then("transpose", order)
    b.values[op.results[0]] = copy_to_new(b, op, out_view)


def _product_axes(spatial: int, outs, nb: int, og: int, groups: int, outs_first: bool) -> tuple[tuple, dict]:
    """(the product's axes [groups, *rows, og], and for each output axis in
    canonical order (batch, feature, *spatial) the product axes it walks)."""
    if outs_first:
        return (groups, *outs, nb, og), {0: [1 + spatial], 1: [0, 2 + spatial],
                                          **{2 + d: [1 + d] for d in range(spatial)}}
    return (groups, nb, *outs, og), {0: [1], 1: [0, 2 + spatial], **{2 + d: [2 + d] for d in range(spatial)}}


def _walks_in_order(order, spatial: int, outs, nb: int, og: int, groups: int, outs_first: bool) -> bool:
    """Whether the output, its axes in `order`, is the product (rows first
    `outs_first` or not) reshaped: no product axis moves (size-1 ones aside)."""
    sizes, walks = _product_axes(spatial, outs, nb, og, groups, outs_first)
    walked = [a for c in order for a in walks[c] if sizes[a] > 1]
    return walked == sorted(walked)
