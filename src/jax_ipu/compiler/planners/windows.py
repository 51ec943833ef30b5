"""Attributes and index arithmetic of windowed ops (convolution,
reduce_window, select_and_scatter, pad). Windows themselves are read
through "windows" view ops (graph.views), a pattern; the per-element
indices here serve what still needs them: the padding mask of a window
or pad whose fill is computed at run time. Defaults follow the StableHLO
spec: an absent attribute means strides and dilations of 1 and no padding."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph.views import window_outputs


def attr(op, name: str, rank: int, default: int) -> tuple[int, ...]:
    """A per-dimension attribute, or its StableHLO default."""
    value = op.attrs.get(name)
    if value is None:
        return (default,) * rank
    return tuple(int(v) for v in np.asarray(value).reshape(-1))


def padding(op, rank: int) -> tuple[tuple[int, int], ...]:
    value = op.attrs.get("padding")
    if value is None:
        return ((0, 0),) * rank
    pairs = np.asarray(value, dtype=np.int64).reshape(rank, 2)
    return tuple((int(lo), int(hi)) for lo, hi in pairs)


def out_size(size: int, window: int, stride: int, pad: tuple[int, int], base_dilation: int,
             window_dilation: int) -> int:
    """Output positions along one axis: the "windows" view op's formula."""
    return window_outputs((size,), ((window, stride, pad[0], pad[1], base_dilation, window_dilation, 0),))[0]


def axis_windows(size: int, window: int, stride: int, pad: tuple[int, int], base_dilation: int,
                 window_dilation: int, out: int, reverse: bool = False) -> np.ndarray:
    """[out, window]: the index along one axis of the element that window
    position w of output o reads, or -1 where it reads padding (edge
    padding or a hole of the base dilation)."""
    o = np.arange(out)[:, None]
    w = np.arange(window)[None, :]
    if reverse:
        w = window - 1 - w
    q = o * stride + w * window_dilation - pad[0]      # coordinate in the dilated operand
    inside = (q >= 0) & (q % base_dilation == 0) & (q // base_dilation < size)
    return np.where(inside, q // base_dilation, -1)


def combine(per_axis: list[np.ndarray], strides: list[int], narrow: bool = False) -> np.ndarray:
    """Flat indices from broadcastable per-axis indices (-1 anywhere makes
    the element padding); int64, or with `narrow` int32 where they fit.
    The scaled parts are summed smallest broadcast first, so that the
    full-size array is written once and clipped once (an im2col of
    [32, 32, 32, 32, 3, 3] indices: batch with features, rows with columns,
    then the two). Padding's part is -big, big beyond any in-range sum;
    sums of parts are clipped to -big, and the result to -1. (A pass per
    axis and a mask per padded axis took seconds of a convolutional
    network's compile.)"""
    per_axis = [np.asarray(index) for index in per_axis]
    if not per_axis:
        return np.zeros((), np.int32 if narrow else np.int64)
    top = sum(max(int(index.max(initial=0)), 0) * int(stride) for index, stride in zip(per_axis, strides, strict=True))
    narrow = narrow and top < 1 << 30         # then -big (2**30) twice still fits an int32
    if top >= 1 << 60:
        raise ValueError(f"window indices up to {top} do not fit an int64")
    big = 1 << 30 if narrow else 1 << 61
    parts, padded = [], False
    for index, stride in zip(per_axis, strides, strict=True):
        part = index.astype(np.int64) * int(stride)
        if (index < 0).any():
            part[index < 0] = -big
            padded = True
        parts.append(part)
    while len(parts) > 2:
        sizes = {(i, j): int(np.prod(np.broadcast_shapes(parts[i].shape, parts[j].shape), dtype=np.int64))
                 for i in range(len(parts)) for j in range(i + 1, len(parts))}
        i, j = min(sizes, key=sizes.get)
        total = np.maximum(parts[i] + parts[j], -big)
        parts = [p for n, p in enumerate(parts) if n not in (i, j)] + [total]
    dtype = np.int32 if narrow else np.int64
    flat = parts[0].astype(dtype) if len(parts) == 1 else np.add(parts[0].astype(dtype), parts[1].astype(dtype))
    if padded:
        np.maximum(flat, -1, out=flat)
    return flat


def row_major_strides(shape) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= int(d)
    return strides[::-1]


def windows(shape, window, strides, pads, base_dilations, window_dilations) -> np.ndarray:
    """[*out_shape, *window]: flat operand indices of every window element
    (-1 for padding), for a window over every axis (reduce_window)."""
    rank = len(shape)
    outs = [out_size(shape[d], window[d], strides[d], pads[d], base_dilations[d], window_dilations[d])
            for d in range(rank)]
    per_axis = []
    for d in range(rank):
        idx = axis_windows(shape[d], window[d], strides[d], pads[d], base_dilations[d], window_dilations[d],
                           outs[d])
        expand = [1] * (2 * rank)
        expand[d], expand[rank + d] = outs[d], window[d]
        per_axis.append(idx.reshape(expand))
    flat = combine(per_axis, row_major_strides(shape))
    return np.broadcast_to(flat, tuple(outs) + tuple(window))
