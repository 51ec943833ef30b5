"""Input dilation moved past a convolution where its kernel is one wide
(poplin's dilatePostConv transform).

The input gradient of a strided convolution is a convolution of the
output gradient dilated by the stride (lhs_dilation). Along a spatial
dimension whose kernel is one position wide (a 1x1 projection's input
gradient) and whose stride is 1, an output element reads one input
element or only the holes between them: the outputs that read input are
every lhs_dilation-th, and each is the convolution of the undilated input
there. So the convolution is made over the undilated input (the outputs
that read nothing left out), and its result spread to the output's shape
with zeros between (stablehlo.pad with interior padding), as poplin does
it: the convolution does lhs_dilation times fewer multiply-adds per such
dimension, and its partial sums and input regions are that much smaller
(the partials of a float16 convolution are float32: four times the
output's bytes in a 2-D stride-2 case, at the peak of a ResNet's backward
pass)."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.planners.windows import attr, padding


def dilate_post_conv(ops: list[ir.Op]) -> list[ir.Op]:
    """The ops with each such convolution rewritten (in nested regions too)."""
    return ir.rewrite(ops, lambda op: _rewritten(op) if op.name == "convolution" else None)


def _rewritten(op: ir.Op) -> list[ir.Op]:
    dn = op.attrs["dimension_numbers"]
    lhs_t, rhs_t, out_t = op.operands[0].type, op.operands[1].type, op.results[0].type
    spatial = len(dn.input_spatial_dimensions)
    if not spatial or min(lhs_t.size, rhs_t.size, out_t.size) == 0:
        return [op]
    strides = attr(op, "window_strides", spatial, 1)
    lhs_dilation = list(attr(op, "lhs_dilation", spatial, 1))
    pads = list(padding(op, spatial))
    rank = len(out_t.shape)
    low, high, interior = [0] * rank, [0] * rank, [0] * rank
    inner_shape = list(out_t.shape)
    changed = False
    for d in range(spatial):
        window = rhs_t.shape[dn.kernel_spatial_dimensions[d]]
        ld = lhs_dilation[d]
        if window != 1 or strides[d] != 1 or ld == 1:
            continue
        size, (lo, _) = lhs_t.shape[dn.input_spatial_dimensions[d]], pads[d]
        outs = out_t.shape[dn.output_spatial_dimensions[d]]
        # Input element i is read by output i * ld + lo alone.
        first = max(0, -(lo // ld))          # ceil(-lo / ld)
        stop = min(size, (outs - 1 - lo) // ld + 1)
        if stop <= first:
            continue          # no output reads input: left as it is
        count = stop - first
        a = dn.output_spatial_dimensions[d]
        low[a] = first * ld + lo
        interior[a] = ld - 1
        high[a] = outs - low[a] - (count - 1) * ld - 1
        inner_shape[a] = count
        lhs_dilation[d] = 1
        pads[d] = (-first, -(size - stop))        # negative padding crops
        changed = True
    if not changed:
        return [op]
    inner = ir.Value(ir.TensorType(tuple(inner_shape), out_t.dtype))
    attrs = {**op.attrs, "lhs_dilation": np.asarray(lhs_dilation, np.int64),
             "padding": np.asarray(pads, np.int64).reshape(spatial, 2)}
    zero = ir.Value(ir.TensorType((), out_t.dtype))
    return [ir.Op("convolution", list(op.operands), [inner], attrs, [], op.loc),
            ir.Op("constant", [], [zero], {"value": np.zeros((), out_t.dtype)}, [], op.loc),
            ir.Op("pad", [inner, zero], [op.results[0]],
                  {"edge_padding_low": tuple(low), "edge_padding_high": tuple(high),
                   "interior_padding": tuple(interior)}, [], op.loc)]
