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
    or the numpy scalar `fill` where indices[i] < 0 (padding; im2col
    patches and windows are Copies of such views)."""
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
        return int(np.prod(self.shape, dtype=np.int64))

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
    view: an int64 array, a padding-free copy and a mask held a ResNet-18
    step's im2col indices three times over (4 GB)."""
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
# in cache too (9.2 ms for 9.4M im2col indices, 11.2 ms taking all at once
# from an intp array).
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
}


_SHAPE = {
    "reshape": lambda shape, new: tuple(new),
    "transpose": lambda shape, perm: tuple(shape[p] for p in perm),
    "slice": lambda shape, starts, limits, strides: tuple(
        len(range(a, b, c)) for a, b, c in zip(starts, limits, strides)),
    "broadcast": lambda shape, new, dims: tuple(new),
    "gather": lambda shape, indices, fill: tuple(indices.shape),
}


def _shape_after(shape: tuple[int, ...], ops: tuple) -> tuple[int, ...]:
    shape = tuple(shape)
    for op in ops:
        shape = _SHAPE[op[0]](shape, *op[1:])
    return shape


def source_tiles(view: View | Concat) -> np.ndarray:
    """For each element a view reads, in the view's (flattened) order, the
    tile that holds it: the view's ops applied to its tensors' per-element
    tiles (uint16), to cost the exchange a Copy needs. Padding is charged
    as a read of the tensor's last element. (Through flat int64 indices
    first, this took 3 s of a ResNet-18 step's compile.)"""
    def tiles(tensor):
        return tensor.mapping.element_tiles()

    def charged(v: View) -> View:
        t = tiles(v.tensor)
        last = t[-1] if len(t) else t.dtype.type(0)
        return View(v.tensor, tuple(("gather", op[1], last) if op[0] == "gather" else op for op in v.ops))
    if isinstance(view, View):
        return charged(view).apply(tiles).ravel()
    return Concat(tuple(charged(p) for p in view.parts), view.axis).apply(tiles).ravel()
