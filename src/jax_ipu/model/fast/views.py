"""The engine's view readers: a view of reshapes, transposes, slices and
broadcasts read as one strided view of its tensor's memory, its layout
found by its first read (the values are view.apply's, as the reference
executors read them: model/executors/common.py)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jax_ipu.graph.views import View
from jax_ipu.model.executors import common


def reader(view: View | object) -> Callable:
    """fn(state) -> the view's array, with the cheapest path for plain
    reads; an immediate as the reference reads it."""
    if not isinstance(view, View):
        return common.reader(view)
    tid, shape = view.tensor.id, view.shape
    if not view.ops or view.is_whole_tensor:
        if shape == view.tensor.shape:
            return lambda state: state[tid]
        return lambda state: state[tid].reshape(shape)
    if all(op[0] in _STRIDED_OPS for op in view.ops):
        return _strided_reader(view)
    return lambda state: view.apply(lambda t: state[t.id])


# View ops whose result is, on a C-ordered tensor, a strided view of its memory.
_STRIDED_OPS = frozenset({"reshape", "transpose", "slice", "broadcast"})


def _strided_reader(view: View) -> Callable:
    """reader() of a view of reshapes, transposes, slices and broadcasts.
    On a C-ordered array of the tensor, such a view is the same strided
    view of its memory on every run: its first read (view.apply) gives its
    layout, and later reads build that view at once (several times
    cheaper than the ops one by one, more so on the cold caches after a
    large product). Any other array is read through view.apply."""
    tid, dtype, size = view.tensor.id, view.tensor.dtype, view.tensor.size
    layout = []           # [(shape, strides, byte offset, read-only)] once known

    def slow(state):
        return view.apply(lambda t: state[t.id])

    def first(state):
        a, out = state[tid], slow(state)
        if (not layout and type(a) is np.ndarray and type(out) is np.ndarray and a.dtype == dtype
                and a.size == size and a.flags.c_contiguous and a.size and out.size):
            offset = out.__array_interface__["data"][0] - a.__array_interface__["data"][0]
            if 0 <= offset < a.nbytes and np.shares_memory(a, out):
                layout.append((out.shape, out.strides, offset, not out.flags.writeable))
        return out

    def read(state):
        if not layout:
            return first(state)
        a = state[tid]
        if type(a) is not np.ndarray or a.dtype != dtype or a.size != size or not a.flags.c_contiguous:
            return slow(state)
        shape, strides, offset, read_only = layout[0]
        out = np.ndarray(shape, dtype, a, offset, strides)
        if read_only:
            out.flags.writeable = False
        return out
    return read
