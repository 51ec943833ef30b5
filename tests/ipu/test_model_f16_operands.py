"""float16 operands of float32 matmul partials (model/executors/matmul.py):
a view reading elements more than once (im2col windows, broadcasts) is
converted as its tensor, then read through the view. The values must be
the bits of converting the view's elements one by one, and within float16
rounding of XLA:CPU's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import SMALL, compile_fn, on_cpu
from jax_ipu.graph.views import apply_ops
from jax_ipu.model.engine import Engine
from jax_ipu.model.executors import matmul

rng = np.random.default_rng(3)


def _conv(x, w, stride, padding):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), padding,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        preferred_element_type=jnp.float32)


CASES = {
    "3x3 same": (lambda x, w: _conv(x, w, 1, "SAME"), (2, 14, 14, 16), (3, 3, 16, 8)),
    "3x3 stride 2 valid": (lambda x, w: _conv(x, w, 2, "VALID"), (1, 15, 15, 8), (3, 3, 8, 12)),
    "7x7 stride 2 same": (lambda x, w: _conv(x, w, 2, "SAME"), (1, 20, 20, 3), (7, 7, 3, 16)),
    "broadcast lhs": (lambda x, w: jnp.broadcast_to(x[:, :1], (x.shape[0], 16, x.shape[2])) @ w,
                      (4, 3, 24), (24, 10)),
    "weight gradient": (lambda x, w: jax.grad(lambda w: jnp.sum(_conv(x, w, 1, "SAME") ** 2))(w),
                        (2, 10, 10, 8), (3, 3, 8, 4)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_converted_operands_keep_the_bits(monkeypatch, name, dtype):
    f, xs, ws = CASES[name]
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) * 0.2).astype(dtype)
    program = compile_fn(f, x, w)
    taken = []

    def counted(array, ops):
        taken.append(array.dtype)
        return apply_ops(array, ops)
    monkeypatch.setattr(matmul, "apply_ops", counted)
    got = Engine(SMALL).run(program, [x, w])
    # The path under test is taken (the engine reads im2col Copies lazily).
    assert bool(taken) == (dtype == np.float16) and all(t == np.float32 for t in taken)

    def element_by_element(view, acc):
        read = matmul.reader(view)
        return read if view.dtype == acc else (lambda state: read(state).astype(acc))
    monkeypatch.setattr(matmul, "_converted", element_by_element)
    want_model = Engine(SMALL).run(compile_fn(f, x, w), [x, w])
    for g, m in zip(got, want_model):
        np.testing.assert_array_equal(g, m)
    want = jax.tree.leaves(on_cpu(f, x, w))
    for g, c in zip(got, want):
        assert g.dtype == c.dtype
        scale = float(np.max(np.abs(np.asarray(c, np.float32)))) or 1.0
        tol = 3e-3 if c.dtype == np.float16 else 2e-5
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(c, np.float32), rtol=tol, atol=tol * scale)
