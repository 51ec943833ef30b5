"""Faster paths of the IPU Model's element-wise codelets give the same bits
as the plain numpy they replace."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from helpers import SMALL, compile_fn
from jax_ipu import ops
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import chains as chains_executor

SHAPES = [((128, 512), (128, 512), ()), ((128, 512), (), (128, 512)), ((128, 512), (1, 512), (128, 1)),
          ((128, 512), (), ()), ((4000,), (4000,), (4000,)), ((7,), (7,), ()),
          ((1, 2048), (16, 2048), (16, 1))]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8, np.bool_, np.int64, np.uint16])
@pytest.mark.parametrize("shapes", SHAPES)
def test_masked_select_picks_the_same_bits_as_where(dtype, shapes):
    rng = np.random.default_rng(0)
    pred = rng.random(shapes[0]) > 0.5
    on_true = np.asarray(rng.standard_normal(shapes[1]) * 100).astype(dtype)
    on_false = np.asarray(rng.standard_normal(shapes[2]) * 100).astype(dtype)
    if np.dtype(dtype).kind == "f":      # NaN payloads and signed zeros survive
        on_true = np.where(rng.random(on_true.shape) > 0.8, np.array(-0.0), on_true).astype(dtype)
        on_true.reshape(-1)[:1] = np.array([0x7FC00123], np.uint32).view(np.float32).astype(dtype)
    got = ops.function_for("select")(pred, on_true, on_false, dtype=np.dtype(dtype), attrs={})
    want = np.where(pred, on_true, on_false)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    # select(p, x, 0) (relu's gradient) takes a shorter path; -0.0 is not
    # zero bits and takes the general one.
    for zero in (np.zeros((), dtype), np.array(-0.0).astype(dtype)):
        got = ops.function_for("select")(pred, on_true, zero, dtype=np.dtype(dtype), attrs={})
        want = np.where(pred, on_true, zero)
        assert got.dtype == want.dtype and got.shape == want.shape and got.base is None
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("n", [100, 70_000])      # whole, and in chunks
def test_maximum_and_minimum_with_a_scalar_give_numpys_values(monkeypatch, n):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n).astype(np.float32)
    x[::97] = np.nan
    x[1::97] = -0.0
    program = compile_fn(lambda a: (jnp.maximum(a * 2, 0.0), jnp.minimum(a + 1, 0.5), jnp.maximum(0.0, a - 1)), x)
    wrapped = []
    real = chains_executor.filled_operand
    monkeypatch.setattr(chains_executor, "filled_operand", lambda *a: wrapped.append(a) or real(*a))
    got = Engine(SMALL).run(program, [x])
    assert len(wrapped) == 3                     # the path under test
    for g, w in zip(got, [np.maximum(x * 2, np.float32(0)), np.minimum(x + 1, np.float32(0.5)),
                          np.maximum(np.float32(0), x - 1)], strict=True):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
