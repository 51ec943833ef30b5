"""Tensor expressions that move no data by themselves (Poplar's reshape,
dimShuffle, slice, broadcast, concat). Programs read tensors through them;
a Copy of a view into a new tensor is how layouts change, at a cost."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from jax_ipu.graph.tensors import Tensor


@dataclasses.dataclass(frozen=True, eq=False)
class View:
    """`tensor` seen through `ops`, applied in order: ("reshape", shape),
    ("transpose", perm), ("slice", starts, limits, strides),
    ("broadcast", shape, dims) with StableHLO's broadcast_in_dim meaning,
    ("gather", indices, fill): element i is the flat element indices[i],
    or the numpy scalar `fill` where indices[i] < 0 (padding),
    ("windows", spec, fill): the sliding windows of the trailing
    len(spec) axes, [..., *sizes] -> [..., *outputs, *window], one
    (window, stride, pad_low, pad_high, base_dilation, window_dilation,
    reverse) per axis with StableHLO's convolution / reduce_window meaning,
    padding and base-dilation holes reading `fill` (im2col patches and
    pooling windows are Copies of such views: a pattern, not an index per
    element)."""
    tensor: Tensor
    ops: tuple = ()
    shape: tuple[int, ...] = None

    def __post_init__(self):
        if self.shape is None:
            object.__setattr__(self, "shape", _shape_after(self.tensor.shape, self.ops))

    @property
    def dtype(self) -> np.dtype:
        return self.tensor.dtype

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return (self.tensor,)

    @property
    def is_whole_tensor(self) -> bool:
        """Reads the tensor's elements in their own order, once each."""
        return all(op[0] == "reshape" for op in self.ops)

    def then(self, *op) -> View:
        if op[0] == "gather":
            op = _gather_op(self.size, *op[1:])
        return View(self.tensor, self.ops + (op,))

    def apply(self, lookup: Callable[[Tensor], np.ndarray]) -> np.ndarray:
        return apply_ops(lookup(self.tensor).reshape(self.tensor.shape), self.ops)


@dataclasses.dataclass(frozen=True, eq=False)
class Concat:
    parts: tuple[View, ...]
    axis: int

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.parts[0].shape)
        shape[self.axis] = sum(p.shape[self.axis] for p in self.parts)
        return tuple(shape)

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].dtype

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(p.tensor for p in self.parts)

    is_whole_tensor = False

    def apply(self, lookup: Callable[[Tensor], np.ndarray]) -> np.ndarray:
        return np.concatenate([p.apply(lookup) for p in self.parts], axis=self.axis)


def apply_ops(array: np.ndarray, ops: tuple) -> np.ndarray:
    for op in ops:
        array = _APPLY[op[0]](array, *op[1:])
    return array


def window_outputs(sizes, spec) -> tuple[int, ...]:
    """Output positions along each windowed axis (the StableHLO formula)."""
    outs = []
    for n, (window, stride, lo, hi, base, dilation, _) in zip(sizes, spec, strict=True):
        padded = (n - 1) * base + 1 + lo + hi if n else lo + hi
        span = (window - 1) * dilation + 1
        outs.append(max(0, (padded - span) // stride + 1) if padded >= span else 0)
    return tuple(outs)


def padded_axis(n: int, lo: int, hi: int, base: int) -> tuple[int, slice, slice]:
    """An axis of n elements padded by lo and hi (negative: cropped) with
    base - 1 holes between elements: (its padded extent, the elements that
    remain, where they land in the padded axis)."""
    extent = max((n - 1) * base + 1 + lo + hi if n else lo + hi, 0)
    first = -(-max(0, -lo) // base)                               # elements cropped by a negative low pad
    stop = min(n, max(first, -(-(extent - lo) // base)))          # and by a negative high pad
    end = lo + (stop - 1) * base + 1 if stop > first else lo + first * base
    return extent, slice(first, stop), slice(lo + first * base, end, base)


def _windows(array: np.ndarray, spec, fill) -> np.ndarray:
    """The "windows" op: the trailing axes padded (and base-dilated) into a
    new array only when needed, then read as overlapping windows through
    strides (a read-only view; a later reshape copies it)."""
    rank = len(spec)
    lead, sizes = array.shape[:array.ndim - rank], array.shape[array.ndim - rank:]
    padded_shape, source, target = list(lead), [slice(None)] * len(lead), [slice(None)] * len(lead)
    reshaped = False
    for n, (_, _, lo, hi, base, _, _) in zip(sizes, spec, strict=True):
        extent, kept, at = padded_axis(n, lo, hi, base)
        source.append(kept)
        target.append(at)
        padded_shape.append(extent)
        reshaped |= (lo, hi, base) != (0, 0, 1)
    if reshaped:
        padded = np.full(padded_shape, 0 if fill is None else fill, dtype=array.dtype)
        padded[tuple(target)] = array[tuple(source)]
    else:
        padded = array
    outs = window_outputs(sizes, spec)
    axis_strides = padded.strides[len(lead):]
    shape = (*lead, *outs, *(w for w, *_ in spec))
    strides = (*padded.strides[:len(lead)], *(st * a for (_, st, *_), a in zip(spec, axis_strides, strict=True)),
               *(d * a for (*_, d, _), a in zip(spec, axis_strides, strict=True)))
    out = np.lib.stride_tricks.as_strided(padded, shape, strides, writeable=False)
    flips = tuple(slice(None, None, -1) if spec[d][6] else slice(None) for d in range(rank))
    return out[(Ellipsis, *flips)] if any(r for *_, r in spec) else out


def _broadcast(array: np.ndarray, shape, dims) -> np.ndarray:
    expanded = [1] * len(shape)
    for i, d in enumerate(dims):
        expanded[d] = array.shape[i]
    return np.broadcast_to(array.reshape(expanded), shape)


def _gather_op(size: int, indices, fill) -> tuple:
    """A gather op as views keep it: flat indices into the `size` elements
    read so far, as int32 where they fit (intp otherwise), padding
    (indices < 0) as `size`, the position of the `fill` element _gather
    appends; fill is None when nothing is padding. One compact array per
    view: an int64 array, a padding-free copy and a mask held a
    convolutional network's im2col indices three times over."""
    dtype = np.int32 if size < np.iinfo(np.int32).max else np.intp
    indices = np.array(indices, dtype=dtype, order="C")      # a copy: written below
    padding = indices < 0
    if padding.any():
        if fill is None:
            raise ValueError("a gather with padding (indices < 0) needs a fill value")
        np.copyto(indices, size, where=padding)
    else:
        fill = None
    return ("gather", indices, fill)


# Indices taken per np.take call: each chunk is widened to intp in a buffer
# that stays in cache, and its values are written while the output chunk is
# in cache too (faster than taking all at once from an intp array).
GATHER_CHUNK = 1 << 18


def _gather(array: np.ndarray, indices: np.ndarray, fill) -> np.ndarray:
    flat = array.reshape(-1)
    if fill is not None:          # padding reads the element after the last
        extended = np.empty(flat.size + 1, dtype=array.dtype)
        extended[:-1] = flat
        extended[-1] = fill
        flat = extended
    out = np.empty(indices.shape, dtype=flat.dtype)
    where, wanted = out.reshape(-1), indices.reshape(-1)
    wide = None if wanted.dtype == np.intp else np.empty(min(GATHER_CHUNK, wanted.size), np.intp)
    for start in range(0, wanted.size, GATHER_CHUNK):
        stop = min(start + GATHER_CHUNK, wanted.size)
        part = wanted[start:stop]
        if wide is not None:
            part = wide[:stop - start]
            part[...] = wanted[start:stop]
        np.take(flat, part, out=where[start:stop], mode="clip")    # every index is in range
    return out


_APPLY = {
    "reshape": lambda a, shape: a.reshape(shape),
    "transpose": lambda a, perm: a.transpose(perm),
    "slice": lambda a, starts, limits, strides: a[tuple(map(slice, starts, limits, strides))],
    "broadcast": _broadcast,
    "gather": _gather,
    "windows": _windows,
}


_SHAPE = {
    "reshape": lambda shape, new: tuple(new),
    "transpose": lambda shape, perm: tuple(shape[p] for p in perm),
    "slice": lambda shape, starts, limits, strides: tuple(
        len(range(a, b, c)) for a, b, c in zip(starts, limits, strides, strict=True)),
    "broadcast": lambda shape, new, dims: tuple(new),
    "gather": lambda shape, indices, fill: tuple(indices.shape),
    "windows": lambda shape, spec, fill: (*shape[:len(shape) - len(spec)],
                                          *window_outputs(shape[len(shape) - len(spec):], spec),
                                          *(w for w, *_ in spec)),
}


def _shape_after(shape: tuple[int, ...], ops: tuple) -> tuple[int, ...]:
    shape = tuple(shape)
    for op in ops:
        shape = _SHAPE[op[0]](shape, *op[1:])
    return shape


# View ops that read elements in a new order (not a strided view of memory),
# with a fill value for padding as their last argument.
REARRANGING = frozenset({"gather", "windows"})


def source_tiles(view: View | Concat) -> np.ndarray:
    """For each element a view reads, in the view's (flattened) order, the
    tile that holds it: the view's ops applied to its tensors' per-element
    tiles (uint16), to cost the exchange a Copy needs. Padding is charged
    as a read of the tensor's last element. (Not through flat int64
    indices first: those took seconds of a convolutional network's compile.)"""
    def tiles(tensor):
        return tensor.mapping.element_tiles()

    def charged(v: View) -> View:
        t = tiles(v.tensor)
        last = t[-1] if len(t) else t.dtype.type(0)
        return View(v.tensor, tuple((op[0], op[1], last) if op[0] in REARRANGING else op for op in v.ops))
    if isinstance(view, View):
        return charged(view).apply(tiles).ravel()
    return Concat(tuple(charged(p) for p in view.parts), view.axis).apply(tiles).ravel()
