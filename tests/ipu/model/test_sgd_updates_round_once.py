"""Chains y +- c * x (SGD updates) run as one BLAS axpy, each element
rounded once as XLA:CPU contracts the multiply into the add: the IPU
Model's bits are XLA:CPU's, at every size (OpenBLAS's own loop for the
last n % 32 elements rounds twice; the Model sends them through its
kernel), donated or not, whatever the gradient's layout."""
from __future__ import annotations

import platform

import jax
import numpy as np
import pytest

from helpers import on_cpu, run_on
from jax_ipu.model.fast import blas

# x86-64 kernels fuse the multiply-add; elsewhere allow the ulp a second rounding makes.
ULPS = 0 if platform.machine() in ("x86_64", "AMD64") else 1

AXPY_FORMS = {
    "w - c*g": lambda w, g: w - 0.01 * g,
    "w - g*c": lambda w, g: w - g * 0.01,
    "w + c*g": lambda w, g: w + 0.3 * g,
    "c*g + w": lambda w, g: 1.7 * g + w,
    "g*c + w": lambda w, g: g * -2.5 + w,
}
SHAPES = [(1,), (7,), (32,), (33,), (63,), (1001,), (31, 3), (65537,), (784, 512)]


@pytest.fixture
def axpy_calls(monkeypatch):
    calls = []
    original = blas.axpy

    def spy(alpha, x, y):
        calls.append((alpha, x.size))
        return original(alpha, x, y)
    monkeypatch.setattr(blas, "axpy", spy)
    return calls


def operands(shape, seed=0, g_shape=None):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(shape) * 100).astype(np.float32)
    g = rng.standard_normal(g_shape or shape).astype(np.float32)
    return w, g


@pytest.mark.parametrize("form", AXPY_FORMS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_axpy_forms_match_xla_cpu(ipu, form, shape, axpy_calls):
    fn = AXPY_FORMS[form]
    w, g = operands(shape)
    want = on_cpu(fn, w, g)
    got = run_on(ipu, fn, w, g)
    np.testing.assert_array_max_ulp(got, want, maxulp=ULPS)
    assert len(axpy_calls) == 1 and axpy_calls[0][1] == w.size


@pytest.mark.parametrize("shape", [(33,), (784, 512)], ids=str)
def test_donated_update_in_place(ipu, shape, axpy_calls):
    w, g = operands(shape, seed=1)
    fn = AXPY_FORMS["w - c*g"]
    want = on_cpu(fn, w, g)
    w_dev = jax.device_put(w, ipu)
    got = jax.jit(fn, donate_argnums=0)(w_dev, jax.device_put(g, ipu))
    np.testing.assert_array_max_ulp(np.asarray(got), want, maxulp=ULPS)
    assert w_dev.is_deleted() and len(axpy_calls) == 1


def test_undonated_inputs_unchanged(ipu, axpy_calls):
    w, g = operands((100, 7), seed=2)
    w_dev, g_dev = jax.device_put(w, ipu), jax.device_put(g, ipu)
    out = jax.jit(AXPY_FORMS["w + c*g"])(w_dev, g_dev)
    np.testing.assert_array_equal(np.asarray(w_dev), w)
    np.testing.assert_array_equal(np.asarray(g_dev), g)
    np.testing.assert_array_max_ulp(np.asarray(out), on_cpu(AXPY_FORMS["w + c*g"], w, g), maxulp=ULPS)
    assert len(axpy_calls) == 1


def test_transposed_gradient(ipu, axpy_calls):
    w, g = operands((512, 10), seed=3, g_shape=(10, 512))
    fn = lambda w, g: w - 0.01 * g.T          # noqa: E731
    np.testing.assert_array_max_ulp(run_on(ipu, fn, w, g), on_cpu(fn, w, g), maxulp=ULPS)
    assert len(axpy_calls) == 1


def test_special_values(ipu, axpy_calls):
    """inf, nan, signed zeros, and a product that overflows on its own but
    not once fused."""
    w = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 3e38, 1.0, -1.0, 5.0] * 5, np.float32)
    g = np.array([1.0, np.inf, 2.0, -0.0, 0.0, -3e38, np.nan, 0.0, 1e-45] * 5, np.float32)
    for form in ("w - c*g", "c*g + w"):
        fn = AXPY_FORMS[form]
        want = on_cpu(fn, w, g)
        got = run_on(ipu, fn, w, g)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_max_ulp(got[~np.isnan(got)], want[~np.isnan(want)], maxulp=ULPS)
    assert len(axpy_calls) == 2


NOT_AXPY = {
    "c*g - w": (lambda w, g: 0.5 * g - w, np.float32),
    "w - g*h": (lambda w, g: w - g * g, np.float32),
    "product kept": (lambda w, g: (w - 0.01 * g) * (0.01 * g), np.float32),
    "float16": (lambda w, g: w - 0.01 * g, np.float16),
    "int32": (lambda w, g: w - 3 * g, np.int32),
    "w - c*g*g": (lambda w, g: w - 0.01 * g * g, np.float32),
}


@pytest.mark.parametrize("case", NOT_AXPY)
def test_other_chains_stay_on_numpy(ipu, case, axpy_calls):
    fn, dtype = NOT_AXPY[case]
    w, g = operands((257,), seed=4)
    w, g = w.astype(dtype), (g * 4).astype(dtype)
    want, got = on_cpu(fn, w, g), run_on(ipu, fn, w, g)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=2e-3 if dtype == np.float16 else 1e-6)
    assert axpy_calls == []


def test_mlp_sgd_step_matches_xla_cpu(ipu, axpy_calls):
    """A whole training step's updates (every parameter: 6 axpys) equal
    XLA:CPU's updates of the same gradients."""
    rng = np.random.default_rng(5)
    params = [(rng.standard_normal((a, b)).astype(np.float32) * 0.1, np.zeros(b, np.float32))
              for a, b in [(20, 16), (16, 3)]]
    grads = jax.tree.map(lambda p: rng.standard_normal(p.shape).astype(np.float32), params)

    def update(params, grads):
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
    want, got = on_cpu(update, params, grads), run_on(ipu, update, params, grads)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_max_ulp(a, b, maxulp=ULPS)
    assert len(axpy_calls) == 4


def test_learning_rate_passed_in_or_computed(ipu, axpy_calls):
    """The scalar may be a tensor: a learning rate passed in, or computed
    in the program (a schedule): read on each run."""
    w, g = operands((300, 70), seed=6)
    passed = lambda w, g, lr: w - lr * g                               # noqa: E731
    scheduled = lambda w, g, step: w - (0.1 * 0.9 ** step) * g          # noqa: E731
    for fn, scalar in ((passed, np.float32(0.01)), (passed, np.float32(-3.5)), (scheduled, np.float32(7))):
        want = on_cpu(fn, w, g, scalar)
        np.testing.assert_array_max_ulp(run_on(ipu, fn, w, g, scalar), want, maxulp=ULPS)
    assert len(axpy_calls) == 3
    step = jax.jit(passed, donate_argnums=0)
    w_dev = jax.device_put(w, ipu)
    for lr in (np.float32(0.5), np.float32(0.25)):        # one program, the scalar read on each run
        w_dev = step(w_dev, jax.device_put(g, ipu), jax.device_put(lr, ipu))
        w = on_cpu(passed, w, g, lr)
    np.testing.assert_array_max_ulp(np.asarray(w_dev), w, maxulp=ULPS)


@pytest.mark.parametrize("lr", [0.0, -0.0], ids=["+0", "-0"])
@pytest.mark.parametrize("form", ["w - lr*g", "lr*g + w"])
def test_a_zero_learning_rate_keeps_nans_infs_and_signed_zeros(ipu, lr, form):
    """BLAS saxpy returns at once for alpha == 0; XLA computes 0 * g, so an
    inf or NaN gradient still makes a NaN and -0.0 + 0.0 is +0.0."""
    fn = {"w - lr*g": lambda w, g, lr: w - lr * g, "lr*g + w": lambda w, g, lr: lr * g + w}[form]
    w = np.array([1.0, 2.0, 3.0, -0.0, 0.0, -0.0, 5.0] * 7, np.float32)
    g = np.array([np.nan, np.inf, -np.inf, 1.0, -1.0, -1.0, 2.0] * 7, np.float32)
    for scalar in (np.float32(lr), None):                 # passed in, and a literal
        f = (lambda w, g, fn=fn: fn(w, g, np.float32(lr))) if scalar is None else fn
        args = (w, g) if scalar is None else (w, g, scalar)
        want, got = on_cpu(f, *args), run_on(ipu, f, *args)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_without_per_thread_blas_threads_the_update_still_happens(ipu, monkeypatch, axpy_calls):
    """numpy wheels with OpenBLAS older than 0.3.27 have no per-thread thread
    count: blas.axpy cannot run, and the chain must not be built as one
    (it returned w unchanged: the update was silently dropped)."""
    monkeypatch.setattr(blas, "set_local_threads", None)
    fn = lambda w, g: w - 0.1 * g                               # noqa: E731
    w, g = operands((1000,), seed=8)
    np.testing.assert_allclose(run_on(ipu, fn, w, g), on_cpu(fn, w, g), rtol=1e-6, atol=1e-5)
    assert axpy_calls == []
