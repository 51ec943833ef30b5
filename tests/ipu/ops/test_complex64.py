"""complex64 on the IPU, which emulates it as pairs of float32
(docs/semantics.md): each op is the float32 ops XLA:CPU expands it to
(jax_ipu/ops_complex.py), each rounded as the IPU rounds float32 ops.

Ops on each part alone (add, subtract, negate, conj, real, imag, complex,
conversions, comparisons, selections, moves) give XLA:CPU's bits. A
product rounds its partial products before the sum on the IPU, where
XLA:CPU may fuse one into a multiply-add (by the host): the IPU must equal
the per-op model, XLA:CPU one of the models. The functions (division,
abs, exp, log, sqrt, pow, tanh...) follow XLA:CPU's formulas with numpy's
float32 functions: equal to XLA:CPU's within a few float32 ulps, and
their zeros, infinities and NaNs in the same places (subnormal inputs
aside, which XLA:CPU reads as zeros)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import C64, SMALL, assert_matches_cpu, on_cpu, run_ipu, run_on
from jax_ipu.compiler import compile_module
from jax_ipu.errors import IpuError
from jax_ipu.stablehlo import import_module

F32 = np.dtype(np.float32)


def _complex(re, im) -> np.ndarray:
    out = np.empty(np.shape(re), C64)
    out.real, out.imag = re, im
    return out


def _random(seed: int, shape=(1001,), scale: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return _complex(rng.standard_normal(shape) * scale, rng.standard_normal(shape) * scale)


# Parts with the values where formulas part ways: zeros of both signs, ones,
# infinities, NaN, the largest values, and some ordinary ones; no
# subnormals (XLA:CPU reads them as zeros).
_PARTS = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3e38, -2.5, 0.5, 88.0, 1e-20]
SPECIAL = _complex(*np.array([(a, b) for a in _PARTS for b in _PARTS], F32).T)


def _same(got, want) -> np.ndarray:
    """Elementwise: each part equal, or both NaN."""
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.kind != "c":
        return (got == want) | (np.isnan(got) & np.isnan(want))
    return _same(got.real, want.real) & _same(got.imag, want.imag)


def _bits(got, want) -> np.ndarray:
    """Elementwise: each part's bits equal, or both NaN."""
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.kind == "c":
        return _bits(got.real.copy(), want.real.copy()) & _bits(got.imag.copy(), want.imag.copy())
    if want.dtype == np.bool_:
        return got == want
    return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


def test_ops_on_parts_give_xla_cpus_bits():
    x, y = _random(0), _random(1)
    x[:len(SPECIAL)], y[:len(SPECIAL)] = SPECIAL, SPECIAL[::-1]
    y[::7] = x[::7]

    def f(a, b):
        return (a + b, a - b, -a, jnp.conj(a), jnp.real(a), jnp.imag(b), lax.complex(jnp.real(b), jnp.imag(a)),
                a == b, a != b, jnp.where(jnp.real(a) > 0, a, b),
                jnp.real(a).astype(jnp.complex64), jnp.isfinite(a))
    got = run_ipu(f, x, y)
    for g, w in zip(got, jax.tree.leaves(on_cpu(f, x, y)), strict=True):
        assert _bits(g, w).all()


def test_products_round_each_partial_product():
    """(ar br - ai bi) + i (ai br + ar bi): the IPU rounds every product;
    XLA:CPU may contract one product of each part into a fused
    multiply-add (it does on hosts with FMA)."""
    x, y = _random(2, scale=1e3), _random(3, scale=1e3)
    ar, ai, br, bi = (v.astype(np.float64) for v in (x.real, x.imag, y.real, y.imag))
    f32 = np.float32
    per_op = _complex(f32(f32(ar * br) - f32(ai * bi)), f32(f32(ai * br) + f32(ar * bi)))
    # The fused forms: one product exact, the other rounded, a single rounding.
    fused = [_complex(f32(ar * br - f32(ai * bi)), f32(ai * br + f32(ar * bi))),
             _complex(f32(f32(ar * br) - ai * bi), f32(f32(ai * br) + ar * bi))]
    got = run_ipu(lambda a, b: a * b, x, y)[0]
    assert _bits(got, per_op).all()
    cpu = on_cpu(lambda a, b: a * b, x, y)
    ok_re = _bits(cpu.real, per_op.real) | _bits(cpu.real, fused[0].real) | _bits(cpu.real, fused[1].real)
    ok_im = _bits(cpu.imag, per_op.imag) | _bits(cpu.imag, fused[0].imag) | _bits(cpu.imag, fused[1].imag)
    assert ok_re.all() and ok_im.all()


FUNCTIONS = {
    "divide": (lambda a, b: a / b, 2e-6), "abs": (jnp.abs, 2e-7), "sign": (lax.sign, 2e-7),
    "exp": (jnp.exp, 2e-6), "expm1": (jnp.expm1, 2e-6), "log": (jnp.log, 2e-6), "log1p": (jnp.log1p, 2e-6),
    "sqrt": (jnp.sqrt, 2e-6), "rsqrt": (lax.rsqrt, 2e-6), "pow": (lambda a, b: lax.pow(a, b * 0.3), 2e-5),
    "tanh": (jnp.tanh, 2e-6), "tan": (jnp.tan, 2e-6), "logistic": (lax.logistic, 2e-6),
    "square": (jnp.square, 2e-6), "sin": (jnp.sin, 2e-6), "cosh": (jnp.cosh, 2e-6),
    "arcsin": (jnp.arcsin, 2e-5), "arctanh": (jnp.arctanh, 2e-5),
}
BINARY = {"divide", "pow"}


def _run(name, x, y):
    """(IPU's result, XLA:CPU's) of FUNCTIONS[name] on x (and y)."""
    fn = FUNCTIONS[name][0]
    args = (x, y) if name in BINARY else (x,)
    return run_ipu(fn, *args)[0], on_cpu(fn, *args)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_functions_match_xla_cpu(name):
    """Within the stated relative tolerance of |result| (float32
    functions differ by ulps; pow's exponent multiplies its error)."""
    rtol = FUNCTIONS[name][1]
    got, want = _run(name, _random(4, scale=1.5), _random(5, scale=1.5))
    scale = np.maximum(np.abs(want.astype(np.complex128)), 1e-30)
    assert (np.abs(got.astype(np.complex128) - want) <= 4 * rtol * scale + 1e-37).all(), name


SPECIAL_FUNCTIONS = ["divide", "abs", "sign", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "tanh", "tan",
                     "logistic"]


@pytest.mark.parametrize("name", SPECIAL_FUNCTIONS)
def test_functions_of_zeros_infinities_and_nan_match_xla_cpu(name):
    """Over every pair of special parts: zeros, infinities and NaN where
    XLA:CPU gives them (its formulas' special cases, not C99's Annex G:
    abs(inf + nan i) is NaN, as on XLA:CPU); finite values within the
    tolerance. Huge parts whose formulas overflow in an intermediate are
    left out of the values compared (3e38 pairs in sqrt, rsqrt)."""
    rtol = FUNCTIONS[name][1]
    x = np.repeat(SPECIAL, len(SPECIAL))
    got, want = _run(name, x, np.tile(SPECIAL, len(SPECIAL)))
    parts = [(got.real, want.real), (got.imag, want.imag)] if want.dtype.kind == "c" else [(got, want)]
    keep = ~((np.abs(x.real) == 3e38) | (np.abs(x.imag) == 3e38)) if name in ("sqrt", "rsqrt") else True
    for g, w in parts:
        finite = np.isfinite(w)
        with np.errstate(invalid="ignore"):      # inf - inf where both are infinite
            close = np.abs(g.astype(np.float64) - w) <= 4 * rtol * np.abs(w) + 1e-37
        special = (g == w) | (np.isnan(g) & np.isnan(w))
        assert (np.where(finite, close, special) | ~keep).all(), name


def test_dot_general_as_four_real_products():
    """Matrix products, batched ones and a complex-by-real one: the real
    products' sums run in the plan's order (scaled tolerance)."""
    a, b = _random(6, (17, 40)), _random(7, (40, 9))
    c, d = _random(8, (3, 5, 12)), _random(9, (3, 12, 4))
    r = np.random.default_rng(10).standard_normal((40, 9)).astype(F32)

    def f(p, q, s, t, u):
        return (p @ q, jnp.einsum("bij,bjk->bik", s, t), p @ u, jnp.vdot(p[0], q[:, 0]), p @ q[:, 0])
    assert_matches_cpu(f, a, b, c, d, r, rtol=1e-5, atol=1e-5, scaled=True)


def test_convolution_as_four_real_ones():
    x, k = _random(11, (2, 8, 8, 3)), _random(12, (3, 3, 3, 4))

    def conv(p, q):
        return lax.conv_general_dilated(p, q, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert_matches_cpu(conv, x, k, rtol=1e-5, atol=1e-5, scaled=True)


def test_reductions_and_cumulative_ops():
    x = _random(13, (6, 50), scale=0.5)

    def f(v):
        return jnp.sum(v, 1), jnp.mean(v, 0), jnp.prod(v[:, :8], 1), jnp.cumsum(v, 1), jnp.cumprod(v[:, :6], 1)
    assert_matches_cpu(f, x, rtol=1e-5, atol=1e-5, scaled=True, target=SMALL)


def test_gather_scatter_sort_and_loops():
    """Lexicographic sorts (real part, then imaginary), gathers and
    scatters, a loop carrying complex values: exact."""
    x = _random(14, (300,))
    x[::5] = _complex(np.round(x.real[::5]), x.imag[::5])    # ties on the real part
    idx = np.array([3, 3, 200, 7], np.int32)
    upd = _random(15, (4,))

    def f(v, i, u):
        looped = lax.fori_loop(0, 3, lambda _, c: jnp.conj(c) + u[0], v[:8])
        return jnp.sort(v), jnp.argsort(v), v[i], v.at[i].set(u * 0 + v[0]), v.at[i].add(u), looped
    assert_matches_cpu(f, x, idx, upd, exact=True, target=SMALL)


def test_transfers_keep_every_bit_and_take_eight_bytes():
    ipu = jax.devices("ipu")[0]
    x = _random(16, (1000,))
    x[:len(SPECIAL)] = SPECIAL
    on_ipu = jax.device_put(x, ipu)
    assert on_ipu.dtype == jnp.complex64
    assert (np.asarray(on_ipu).view(np.uint32) == x.view(np.uint32)).all()
    compiled = jax.jit(lambda v: v * 2).lower(on_ipu).compile()
    assert compiled.memory_analysis().argument_size_in_bytes == 8 * x.size
    back = run_on(ipu, lambda v: v, x)
    assert (back.view(np.uint32) == x.view(np.uint32)).all()


def test_orderings_of_complex_numbers_are_refused():
    """stablehlo.compare LT of complex values (which have no order) is
    refused at compile time, naming the op."""
    text = """
    func.func public @main(%a: tensor<3xcomplex<f32>>) -> tensor<3xi1> {
      %0 = stablehlo.compare LT, %a, %a : (tensor<3xcomplex<f32>>, tensor<3xcomplex<f32>>) -> tensor<3xi1>
      return %0 : tensor<3xi1>
    }"""
    with pytest.raises(IpuError, match="stablehlo.compare.*complex numbers have no order"):
        compile_module(import_module(text), SMALL)
