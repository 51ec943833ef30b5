"""The engine's view readers: a view of reshapes, transposes, slices and
broadcasts is read as a strided view built from the layout its first read
found. Every read must equal view.apply, whatever array the state holds."""
from __future__ import annotations

import numpy as np
import pytest

from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.model.fast.views import reader


def tensor(shape, dtype=np.float32) -> Tensor:
    size = int(np.prod(shape))
    return Tensor(0, "t", tuple(shape), np.dtype(dtype), TileMapping.linear(size, 4))


VIEWS = [
    ((512,), [("reshape", (1, 512)), ("broadcast", (128, 512), (0, 1))]),
    ((128,), [("reshape", (128, 1)), ("broadcast", (128, 10), (0, 1))]),
    ((6, 5), [("transpose", (1, 0)), ("reshape", (1, 5, 6))]),
    ((6, 5), [("slice", (1, 0), (6, 5), (2, 2)), ("transpose", (1, 0))]),
    ((4, 6), [("transpose", (1, 0)), ("slice", (1, 1), (6, 4), (1, 2)), ("broadcast", (3, 5, 2), (1, 2))]),
    ((2, 3, 4), [("transpose", (2, 0, 1)), ("slice", (0, 0, 1), (4, 2, 3), (3, 1, 1))]),
    ((3, 4), [("broadcast", (2, 3, 4), (1, 2)), ("reshape", (6, 4))]),      # a copy: not a view
]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("shape, ops", VIEWS)
@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.bool_])
def test_strided_reads_equal_apply(shape, ops, dtype):
    t = tensor(shape, dtype)
    view = View(t, tuple(ops))
    read = reader(view)
    rng = np.random.default_rng(0)
    for run in range(4):
        value = (rng.standard_normal(t.size) * 10).astype(dtype)
        state = [value.reshape(shape) if run % 2 else value]      # flat or shaped, as kernels leave them
        got, want = read(state), view.apply(lambda x, state=state: state[x.id])
        assert same(got, want)
        assert got.flags.writeable == want.flags.writeable
        if np.shares_memory(want, value):
            assert np.shares_memory(got, value)     # a view, as apply's, never a stale copy
        value[...] = 0
        assert same(read(state), view.apply(lambda x, state=state: state[x.id]))


@pytest.mark.parametrize("shape, ops", VIEWS[:6])
def test_strided_reader_takes_any_layout(shape, ops):
    """After a C-ordered first read, arrays laid out otherwise (transposed,
    strided, of another dtype's bits, a scalar for a 1-element tensor, not
    an array) are read through view.apply."""
    t = tensor(shape)
    view = View(t, tuple(ops))
    read = reader(view)
    rng = np.random.default_rng(1)
    base = rng.standard_normal(t.size).astype(np.float32)
    state = [base.reshape(shape)]
    assert same(read(state), view.apply(lambda x: state[x.id]))
    others = [np.asfortranarray(base.reshape(shape)),
              rng.standard_normal(2 * t.size).astype(np.float32)[::2].reshape(shape),
              base.reshape(shape).astype(np.float64)]
    for other in others:
        state[0] = other
        assert same(read(state), view.apply(lambda x, state=state: state[x.id]))
    state[0] = base.copy().reshape(shape)
    assert same(read(state), view.apply(lambda x: state[x.id]))


def test_read_only_source_stays_read_only():
    t = tensor((6, 5))
    view = View(t, (("transpose", (1, 0)), ("slice", (0, 1), (5, 6), (1, 1))))
    read = reader(view)
    value = np.arange(30, dtype=np.float32).reshape(6, 5)
    assert read([value]).flags.writeable
    frozen = value.copy()
    frozen.flags.writeable = False
    got = read([frozen])
    assert same(got, value.T[:, 1:]) and not got.flags.writeable
