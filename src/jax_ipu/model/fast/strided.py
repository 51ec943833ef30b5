"""Views of reshapes, transposes, slices, broadcasts and windows read as one
strided array over their tensor's memory (padded once first, when the
windows pad), so that a matmul operand is made in one copy whose inner
loop runs along the source's contiguous axis, or not copied at all.

Why: numpy applies a view's ops one by one, and a reshape of a strided
view copies it in the destination's order. An im2col patch matrix read
that way copied its elements with an inner loop over the window's few
columns (3 elements, each from another row), and a transposed kernel was
copied twice: a convolutional network's operands took a large share of
its training step on the host. Here the view is worked out once, at load time, as "sub-axes"
(size, stride) of its tensor's memory per axis of the result; a run then
fills the operand in one np.copyto, in C order or with its last two axes
swapped (BLAS reads either), whichever reads the source in longer runs.
The values are the elements the view names, whatever the layout."""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from jax_ipu.graph.views import View, padded_axis, window_outputs
from jax_ipu.model.fast import xla_chains


class _Unplannable(Exception):
    """The view is not one strided array of its (padded) tensor."""


def _merged(subs: list) -> list:
    """Sub-axes (size, stride) in C order without size-1 ones, each run of
    them that steps through memory as one axis merged."""
    out: list = []
    for size, stride in subs:
        if size == 1:
            continue
        if out and out[-1][1] == size * stride:
            out[-1] = (out[-1][0] * size, stride)
        else:
            out.append((size, stride))
    return out


def _reshape(axes: list, shape) -> list:
    flat = _merged([s for axis in axes for s in axis])
    out = []
    for n in shape:
        axis, need = [], n
        while need > 1:
            if not flat:
                raise _Unplannable
            size, stride = flat[0]
            if need % size == 0:
                axis.append(flat.pop(0))
                need //= size
            elif size % need == 0:       # the front sub-axis splits: its outer part here
                axis.append((need, stride * (size // need)))
                flat[0] = (size // need, stride)
                need = 1
            else:
                raise _Unplannable
        out.append(axis)
    if flat:
        raise _Unplannable
    return out


def _slice(axes: list, offset: int, starts, limits, steps) -> tuple[list, int]:
    out = []
    for axis, a, b, c in zip(axes, starts, limits, steps, strict=True):
        size = math.prod(s for s, _ in axis)
        if (a, b, c) == (0, size, 1):
            out.append(axis)
            continue
        subs = _merged(axis)
        if len(subs) != 1:
            raise _Unplannable
        stride = subs[0][1]
        offset += a * stride
        out.append([(len(range(a, b, c)), stride * c)])
    return out, offset


def _broadcast(axes: list, shape, dims) -> list:
    out = [[(n, 0)] for n in shape]
    for a, d in enumerate(dims):
        if math.prod(s for s, _ in axes[a]) == shape[d]:
            out[d] = axes[a]
    return out


class _Pad:
    """A run-time step: the planned view so far copied into a new buffer
    (its sub-axes in memory order, the windowed ones padded with `fill`
    and base-dilated), which the rest of the view then reads."""

    def __init__(self, axes: list, offset: int, spec, fill):
        rank = len(spec)
        # Size-1 axes (no sub-axis left) become one sub-axis of stride 0.
        axes = [axis or [(1, 0)] for axis in axes]
        if any(len(axis) != 1 for axis in axes[-rank:]):
            raise _Unplannable
        subs = [s for axis in axes for s in axis]
        if any(stride < 0 or (stride == 0 and size > 1) for size, stride in subs):
            raise _Unplannable
        first_windowed = len(subs) - rank
        # Memory order: the source is read as it lies, and the padded copy
        # keeps its layout (channels-last stays channels-last).
        order = sorted(range(len(subs)), key=lambda i: -subs[i][1])
        src_sizes, src_strides, shape, target = [], [], [], []
        start = offset
        for i in order:
            size, stride = subs[i]
            src_strides.append(stride)
            if i < first_windowed:
                src_sizes.append(size)
                shape.append(size)
                target.append(slice(None))
                continue
            _, _, lo, hi, base, _, _ = spec[i - first_windowed]
            extent, kept, at = padded_axis(size, lo, hi, base)
            start += kept.start * stride
            src_sizes.append(max(kept.stop - kept.start, 0))
            shape.append(extent)
            target.append(at)
        self.shape, self.target, self.fill = tuple(shape), tuple(target), fill
        self.src = (tuple(src_sizes), tuple(src_strides), start)
        # Where each sub-axis lies in the padded buffer.
        strides = _c_strides(shape)
        at = {i: j for j, i in enumerate(order)}
        self.axes, i = [], 0
        for axis in axes:
            self.axes.append([(shape[at[i + j]], strides[at[i + j]]) for j in range(len(axis))])
            i += len(axis)

    def __call__(self, flat: np.ndarray) -> np.ndarray:
        buffer = np.full(self.shape, 0 if self.fill is None else self.fill, dtype=flat.dtype)
        sizes, strides, start = self.src
        item = flat.itemsize
        source = as_strided(flat[start:], sizes, tuple(s * item for s in strides), writeable=False)
        buffer[self.target] = source
        return buffer.reshape(-1)


def _windows(axes: list, offset: int, spec) -> tuple[list, int]:
    rank = len(spec)
    lead, spatial = axes[:len(axes) - rank], axes[len(axes) - rank:]
    outs, windows = [], []
    sizes = [math.prod(s for s, _ in axis) for axis in spatial]
    counts = window_outputs(sizes, spec)
    for axis, count, (window, stride, lo, hi, base, dilation, reverse) in zip(spatial, counts, spec, strict=True):
        if (lo, hi, base) != (0, 0, 1):
            raise _Unplannable         # a _Pad comes first
        subs = _merged(axis)
        if len(subs) > 1:
            raise _Unplannable
        step = subs[0][1] if subs else 0
        outs.append([(count, step * stride)])
        if reverse:
            offset += (window - 1) * dilation * step
            windows.append([(window, -dilation * step)])
        else:
            windows.append([(window, dilation * step)])
    return lead + outs + windows, offset


class Plan:
    """A view as sub-axes of its tensor's memory: `pads` (at most one _Pad)
    run first, then the result's axis i is `axes[i]`, C-ordered sub-axes
    (size, stride in elements) from `offset`."""

    def __init__(self, view: View):
        axes = [[(n, s)] for n, s in zip(view.tensor.shape, _c_strides(view.tensor.shape), strict=True)]
        offset, pads = 0, []
        for op in view.ops:
            name = op[0]
            if name == "reshape":
                axes = _reshape(axes, op[1])
            elif name == "transpose":
                axes = [axes[p] for p in op[1]]
            elif name == "slice":
                axes, offset = _slice(axes, offset, *op[1:])
            elif name == "broadcast":
                axes = _broadcast(axes, op[1], op[2])
            elif name == "windows":
                spec, fill = op[1], op[2]
                if any((lo, hi, base) != (0, 0, 1) for _, _, lo, hi, base, _, _ in spec):
                    if pads:
                        raise _Unplannable
                    pad = _Pad(axes, offset, spec, fill)
                    pads.append(pad)
                    axes, offset = pad.axes, 0
                    spec = tuple((w, s, 0, 0, 1, d, r) for w, s, _, _, _, d, r in spec)
                axes, offset = _windows(axes, offset, spec)
            else:
                raise _Unplannable
        if [math.prod(s for s, _ in axis) for axis in axes] != list(view.shape):
            raise _Unplannable
        self.axes, self.offset, self.pads = axes, offset, pads


def _c_strides(shape) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return strides[::-1]


def plan(view: View) -> Plan | None:
    """The view's Plan, or None when it is not one strided array of its
    (once padded) tensor (gathers, slices of merged axes...)."""
    if not isinstance(view, View) or view.size == 0 or view.tensor.size == 0:
        return None
    try:
        return Plan(view)
    except _Unplannable:
        return None


def _run(subs: list) -> int:
    """Elements the innermost loop over `subs` (C order) reads in a row."""
    merged = _merged(subs)
    return merged[-1][0] if merged and merged[-1][1] == 1 else 1


def operand_reader(view: View, dtype: np.dtype):
    """fn(state) -> the view's [batch, rows, cols] array in `dtype`, for a
    BLAS call: a strided view of the tensor when BLAS can read it so, else
    one copy, C-ordered or with its last two axes swapped (the layout
    whose inner loop reads longer runs of the source). None when the view
    is not planned (the caller reads it as before)."""
    found = plan(view)
    if found is None or len(found.axes) != 3:
        return None
    dtype = np.dtype(dtype)
    batch, rows, cols = found.axes
    swapped = _run(batch + cols + rows) > _run(batch + rows + cols)
    order = batch + cols + rows if swapped else batch + rows + cols
    sizes = tuple(s for s, _ in order)
    strides = tuple(s for _, s in order)
    tid, tensor_dtype, size, shape = view.tensor.id, view.tensor.dtype, view.tensor.size, tuple(view.shape)
    offset, pads = found.offset, found.pads
    # The tensor is converted first when the view reads its elements at
    # least once each (patches read them up to window-size times); else the
    # copy converts what it reads.
    convert_first = tensor_dtype != dtype and view.size >= size
    direct = _blas_view(found.axes) and (tensor_dtype == dtype or convert_first)
    bshape = (shape[0], shape[2], shape[1]) if swapped else shape

    def read(state):
        flat = state[tid]
        if type(flat) is not np.ndarray or flat.dtype != tensor_dtype or flat.size != size \
                or not flat.flags.c_contiguous:
            return None
        flat = flat.reshape(-1)
        if convert_first:
            flat = xla_chains.convert(flat, dtype)
        for pad in pads:
            flat = pad(flat)
        item = flat.itemsize
        source = as_strided(flat[offset:], sizes, tuple(s * item for s in strides), writeable=False)
        if direct:
            return source.reshape(bshape).swapaxes(1, 2) if swapped else source.reshape(shape)
        out = xla_chains.aligned_empty(sizes, dtype)
        np.copyto(out, source, casting="unsafe")
        out = out.reshape(bshape)
        return out.swapaxes(1, 2) if swapped else out
    return read


def _blas_view(axes: list) -> bool:
    """Whether [batch, rows, cols] sub-axes are, as they stand, a strided
    array BLAS reads in place: rows and cols each one stride, one of them
    unit, and the batch one stride too."""
    merged = [_merged(axis) for axis in axes]
    if any(len(m) > 1 for m in merged):
        return False
    steps = [m[0][1] if m else 0 for m in merged]
    return 1 in steps[1:] and all(s > 0 for s in steps[1:])
