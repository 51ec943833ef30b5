"""Matmul operands read as one strided array of their tensor (model.fast.
strided): random chains of view ops (reshapes, transposes, slices,
broadcasts, windows with padding, dilation and reversal) give exactly the
elements the ops applied one by one give, in float32 from float16 or
float32 tensors; and the layouts it picks are the ones BLAS reads (C order
or the last two axes swapped) or the tensor's memory itself."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View, apply_ops, window_outputs
from jax_ipu.model.fast import strided


def _tensor(shape, dtype) -> Tensor:
    return Tensor(0, "x", tuple(shape), np.dtype(dtype), TileMapping.linear(int(np.prod(shape)), 2))


def _check(view: View, a: np.ndarray) -> np.ndarray | None:
    """The planned operand against the ops applied one by one (None: not planned)."""
    read = strided.operand_reader(view, np.float32)
    if read is None:
        return None
    got = read({view.tensor.id: a})
    want = apply_ops(a.astype(np.float32), view.ops)
    assert got.shape == want.shape == view.shape
    np.testing.assert_array_equal(got, want)
    # A layout BLAS reads: the rows or the columns one element apart.
    assert got.size <= 1 or 4 in got.strides[1:] or 1 in got.shape[1:]
    return got


@st.composite
def _views(draw):
    """A view of a tensor ending as [batch, rows, cols]."""
    rank = draw(st.integers(2, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from([np.float16, np.float32]))
    view = View(_tensor(shape, dtype))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["transpose", "slice", "broadcast", "windows", "reshape"]))
        cur = view.shape
        if kind == "transpose":
            view = view.then("transpose", tuple(draw(st.permutations(range(len(cur))))))
        elif kind == "slice":
            starts = [draw(st.integers(0, n - 1)) for n in cur]
            limits = [draw(st.integers(s + 1, n)) for s, n in zip(starts, cur, strict=True)]
            steps = [draw(st.integers(1, 2)) for _ in cur]
            view = view.then("slice", tuple(starts), tuple(limits), tuple(steps))
        elif kind == "broadcast":
            new = (draw(st.integers(1, 3)), *cur)
            view = view.then("broadcast", new, tuple(range(1, len(new))))
        elif kind == "windows":
            spatial = draw(st.integers(1, min(2, len(cur))))
            spec = tuple((draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(-1, 2)),
                          draw(st.integers(-1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2)),
                          draw(st.integers(0, 1))) for _ in range(spatial))
            if 0 in window_outputs(cur[len(cur) - spatial:], spec):
                continue
            view = view.then("windows", spec, np.zeros((), dtype))
        else:
            flat = int(np.prod(cur))
            split = [d for d in range(1, flat + 1) if flat % d == 0]
            first = draw(st.sampled_from(split))
            view = view.then("reshape", (first, flat // first))
    cur = view.shape
    cut = draw(st.integers(0, len(cur)))
    cut2 = draw(st.integers(cut, len(cur)))
    final = (int(np.prod(cur[:cut])), int(np.prod(cur[cut:cut2])), int(np.prod(cur[cut2:])))
    return view.then("reshape", final)


@settings(max_examples=300, deadline=None)
@given(_views(), st.integers(0, 2**31))
def test_planned_operands_read_the_views_elements(view, seed):
    a = (np.random.default_rng(seed).standard_normal(view.tensor.shape) * 8).astype(view.tensor.dtype)
    _check(view, a)


def _conv_patches(n, h, w, c, window, stride, pad, base=1, dilation=1, reverse=0, rows_outs_first=False):
    """An NHWC input's im2col patches as the convolution lowering reads them:
    [1, rows, window x features]."""
    view = View(_tensor((n, h, w, c), np.float16)).then("transpose", (0, 3, 1, 2))
    spec = ((window, stride, pad, pad, base, dilation, reverse),) * 2
    view = view.then("reshape", (1, n, c, h, w)).then("windows", spec, np.zeros((), np.float16))
    rows = (3, 4, 1) if rows_outs_first else (1, 3, 4)
    view = view.then("transpose", (0, *rows, 5, 6, 2))
    shape = view.shape
    return view.then("reshape", (1, int(np.prod(shape[1:4])), int(np.prod(shape[4:]))))


@pytest.mark.parametrize("case", [
    dict(n=2, h=9, w=9, c=16, window=3, stride=1, pad=1),
    dict(n=1, h=12, w=10, c=3, window=7, stride=2, pad=3),
    dict(n=2, h=6, w=6, c=8, window=3, stride=1, pad=2, base=2),          # a strided convolution's input gradient
    dict(n=2, h=8, w=8, c=8, window=3, stride=1, pad=1, reverse=1),
    dict(n=2, h=8, w=8, c=8, window=2, stride=2, pad=0, dilation=2),
    dict(n=2, h=8, w=8, c=4, window=3, stride=1, pad=1, rows_outs_first=True),
])
def test_convolution_patches_are_planned_and_exact(case):
    view = _conv_patches(**case)
    a = (np.random.default_rng(0).standard_normal(view.tensor.shape) * 8).astype(np.float16)
    got = _check(view, a)
    assert got is not None
    # Channels-last patches are read in runs of whole feature vectors: C order.
    if not case.get("rows_outs_first"):
        assert got.flags.c_contiguous


def test_a_transposed_read_is_taken_in_place():
    """[features, positions] of a float32 NHWC tensor is the tensor's memory
    read transposed: no copy (BLAS takes the transposed layout)."""
    t = _tensor((2, 4, 4, 8), np.float32)
    view = View(t).then("transpose", (3, 0, 1, 2)).then("reshape", (1, 8, 32))
    a = np.random.default_rng(1).standard_normal(t.shape).astype(np.float32)
    got = _check(view, a)
    assert got is not None and np.shares_memory(got, a)


def test_gathers_and_odd_arrays_fall_back():
    t = _tensor((4, 6), np.float16)
    gathered = View(t).then("gather", np.array([[3, 1, 0]]), None).then("reshape", (1, 1, 3))
    assert strided.operand_reader(gathered, np.float32) is None
    view = View(t).then("reshape", (1, 4, 6))
    read = strided.operand_reader(view, np.float32)
    # An array that is not the tensor's C-ordered memory is left to the caller.
    assert read({0: np.asfortranarray(np.ones((4, 6), np.float16))}) is None
    assert read({0: np.ones((4, 6), np.float32)}) is None
