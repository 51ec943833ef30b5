"""A product whose only use is a transpose swapping its operands' free
dimensions is computed with its operands swapped when that moves fewer
elements (compiler/passes/fold_transposes.py): JAX's weight gradients."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import SMALL, assert_matches_cpu, compile_fn, lower
from jax_ipu.compiler.passes.fold_transposes import fold_result_transposes
from jax_ipu.compiler.passes.legalize import legalize
from jax_ipu.graph.programs import Copy, leaves

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def folded_ops(f, *args) -> list[str]:
    flat = legalize(lower(f, *args))
    return [op.name for op in fold_result_transposes(flat.ops, flat.results)]


def transposing_copies(program) -> list[tuple[int, ...]]:
    return [s.dst.shape for s in leaves(program.body) if isinstance(s, Copy)
            and any(op[0] == "transpose" for op in getattr(s.src, "ops", ()))]


def test_weight_gradient_is_computed_in_the_weights_layout():
    x, g = f32(128, 784), f32(128, 512)

    def weight_grad(x, g):
        return jax.vjp(lambda w: x @ w, jnp.zeros((784, 512)))[1](g)[0]
    assert "transpose" in [op.name for op in legalize(lower(weight_grad, x, g)).ops]
    assert "transpose" not in folded_ops(weight_grad, x, g)
    # Only x^T (784 x 128) is rearranged: not g^T (512 x 128) and then the
    # 784 x 512 gradient.
    assert transposing_copies(compile_fn(weight_grad, x, g)) == [(784, 128)]
    assert_matches_cpu(weight_grad, x, g, target=SMALL, rtol=2e-5, atol=1e-5)


def test_a_fold_that_would_move_more_is_not_made():
    a, b = f32(8, 64), f32(64, 8)
    assert "transpose" in folded_ops(lambda a, b: (a @ b).T, a, b)
    assert_matches_cpu(lambda a, b: (a @ b).T + 1, a, b, target=SMALL, rtol=2e-5, atol=1e-5)
    x, g = f32(128, 784), f32(128, 64)      # a narrow gradient: g^T and the result are small
    assert "transpose" in folded_ops(lambda x, g: (g.T @ x).T, x, g)


@pytest.mark.parametrize("spec", ["bij,bjk->bki", "bji,bjk->bki", "ij,kj->ji"])
def test_batched_and_contracting_forms(spec):
    lhs_spec, rest = spec.split(",")
    rhs_spec, out_spec = rest.split("->")
    sizes = {"b": 3, "i": 40, "j": 24, "k": 56}
    a = f32(*[sizes[c] for c in lhs_spec])
    b = f32(*[sizes[c] for c in rhs_spec])
    assert_matches_cpu(lambda a, b: jnp.einsum(spec, a, b), a, b, target=SMALL, rtol=2e-5, atol=1e-5)


def test_a_product_with_other_uses_is_kept():
    x, w = f32(64, 96), f32(64, 32)

    def f(x, w):
        p = x.T @ w
        return p.T * 2, p.sum()
    ops = folded_ops(f, x, w)
    assert ops.count("dot_general") == 1 and "transpose" in ops
    assert_matches_cpu(f, x, w, target=SMALL, rtol=2e-5, atol=1e-5)


def test_in_a_scan_body_and_through_the_plugin(ipu):
    # Data of its own (the module's generator gives each test other data
    # depending on which tests ran before it in the same worker).
    rng = np.random.default_rng(5)
    xs, w0 = rng.standard_normal((5, 32, 48)).astype(np.float32), rng.standard_normal((48, 16)).astype(np.float32)

    def train(w, xs):
        def step(w, x):
            g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
            return w - 0.1 * g, jnp.sum(g)
        return jax.lax.scan(step, w, xs)
    w_got, sums_got = jax.jit(train)(jax.device_put(w0, ipu), jax.device_put(xs, ipu))
    w_want, sums_want = jax.jit(train)(w0, xs)
    np.testing.assert_allclose(np.asarray(w_got), np.asarray(w_want), rtol=1e-4, atol=1e-4)
    # Each sum adds 768 gradient elements that cancel (to a few units from
    # tens): its rounding follows the summation order, which differs from
    # XLA:CPU's (over 40 seeds: at most 1.6e-3 apart).
    np.testing.assert_allclose(np.asarray(sums_got), np.asarray(sums_want), rtol=1e-4, atol=5e-3)
