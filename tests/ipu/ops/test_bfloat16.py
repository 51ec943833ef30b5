"""bfloat16 on the IPU, which emulates it (docs/semantics.md): held in 16
bits, every op computed in float32 on the operands widened and rounded to
bfloat16 (to nearest even) after it, as XLA:CPU normalizes bfloat16 ops.

Each op is checked against a numpy model of that rule (widen, the float32
op, round), which the IPU must equal bit for bit; XLA:CPU rounds per op too
(its HLO keeps each f32 -> bf16 -> f32 convert pair), so for correctly
rounded ops it gives the same bits, on any host, for inputs holding no
subnormal numbers (which XLA:CPU reads as zeros). Transcendental ops are
numpy's float32 functions here and XLA's there, a few float32 ulps apart:
their bfloat16 results may differ by one bfloat16 ulp."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from helpers import BF16, SMALL, assert_matches_cpu, on_cpu, run_ipu, run_on, values
from jax_ipu.ops import OPS

F32 = np.dtype(np.float32)
ULP = 2.0 ** -7          # one bfloat16 ulp, relative


def _bf16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16)


def _normal(seed: int, n: int = 1001, positive: bool = False) -> np.ndarray:
    """bfloat16 values with their edge cases (zeros of both signs, ties,
    infinities, NaN), none subnormal."""
    return values(BF16, (n,), seed=seed, positive=positive)


def _model(op: str, *args, **attrs):
    """The IPU's rule: widen, numpy's float32 op as ops.py defines it, round."""
    wide = [np.asarray(a).astype(np.float32) for a in args]
    record = OPS[op]
    with np.errstate(all="ignore"):
        if record.ufunc is not None or record.float_ufunc is not None:
            out = (record.ufunc or record.float_ufunc)(*wide)
        else:
            out = record.function(*wide, dtype=F32, attrs=attrs)
    out = np.asarray(out)
    return out.astype(BF16) if out.dtype == F32 else out


def _same_bits(got, want) -> np.ndarray:
    """Elementwise: equal bits, or both NaN (payloads are not compared)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == np.bool_:
        return got == want
    bits = np.dtype(f"u{want.dtype.itemsize}")
    nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    return (got.view(bits) == want.view(bits)) | nan


UNARY = {name: op for name, op in OPS.items() if op.arity == 1 and "f" in op.kinds
         and name not in ("convert", "bitcast_convert", "reduce_precision", "real", "imag")}
BINARY = {name: op for name, op in OPS.items() if op.arity == 2 and "f" in op.kinds
          and name not in ("compare", "complex")}
EXACT = {"negate", "abs", "sign", "floor", "ceil", "round_nearest_even", "round_nearest_afz", "is_finite", "sqrt",
         "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum"}
POSITIVE = {"sqrt", "rsqrt", "log", "log_plus_one"}


# JAX lowers lax.logistic as 1 / (1 + exp(-x)), four ops each rounded to
# bfloat16 (as XLA's LogisticExpander writes it for the CPU).
SEVERAL_OPS = {"logistic"}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_widen_compute_and_round(name):
    x = _normal(0, positive=name in POSITIVE)
    fn = UNARY[name].lax(lax)
    got = run_ipu(fn, x)[0]
    if name not in SEVERAL_OPS:
        assert _same_bits(got, _model(name, x)).all()
    want = on_cpu(fn, x)
    if name in EXACT:
        assert _same_bits(got, want).all(), name
    else:
        assert_matches_cpu(fn, x, rtol=ULP, atol=1e-30, got=[got])


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_widen_compute_and_round(name):
    x, y = _normal(1), _normal(2)
    y[::5] = x[::5]
    fn = BINARY[name].lax(lax)
    got = run_ipu(fn, x, y)[0]
    assert _same_bits(got, _model(name, x, y)).all()
    if name in EXACT:
        assert _same_bits(got, on_cpu(fn, x, y)).all(), name
    else:
        assert_matches_cpu(fn, x, y, rtol=ULP, atol=1e-30, got=[got])


def test_comparisons_select_and_clamp_are_exact():
    x, y = _normal(3), _normal(4)
    y[::3] = x[::3]

    def f(a, b):
        return (a == b, a != b, a < b, a <= b, a > b, a >= b, jnp.where(a < b, a, b),
                lax.clamp(jnp.bfloat16(-1.5), a, jnp.bfloat16(2.25)))
    assert_matches_cpu(f, x, y, exact=True, target=SMALL)


def test_a_chain_rounds_after_every_op():
    """x * y + z, rounded to bfloat16 after the product: keeping the product
    in float32 (one rounding) gives other bits for many of these values.
    The IPU rounds every op; XLA:CPU is asked only for one of the two
    rules (it rounds every op on the hosts measured, docs/semantics.md)."""
    rng = np.random.default_rng(0)
    x, y = _bf16(rng.uniform(1, 2, 4096)), _bf16(rng.uniform(1, 2, 4096))
    z = _bf16(rng.uniform(-4, 4, 4096))
    per_op = _bf16(_bf16(x.astype(F32) * y.astype(F32)).astype(F32) + z.astype(F32))
    fused = _bf16(x.astype(F32) * y.astype(F32) + z.astype(F32))
    assert (per_op.view(np.uint16) != fused.view(np.uint16)).sum() > 100
    fn = jax.jit(lambda a, b, c: a * b + c)
    got = run_ipu(fn, x, y, z)[0]
    assert _same_bits(got, per_op).all()
    cpu = on_cpu(fn, x, y, z)
    assert (_same_bits(cpu, per_op) | _same_bits(cpu, fused)).all()


def test_rounding_to_nearest_even_nan_and_overflow():
    """float32 -> bfloat16: ties to even, overflow to infinity, NaN kept a
    (quiet) NaN of its sign; the largest values round to infinity."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F808001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800001,
                     0xFFC00001, 0x7FFFFFFF, 0x7F800000, 0x80000000, 0x4B800001], np.uint32)
    x = bits.view(np.float32)
    want = np.array([0x3F80, 0x3F82, 0x3F81, 0x3F81, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7FC0, 0x7F80, 0x8000,
                     0x4B80], np.uint16)
    got = run_ipu(lambda v: v.astype(jnp.bfloat16), x)[0]
    nan = np.isnan(x)
    assert (got.view(np.uint16)[~nan] == want[~nan]).all()
    assert np.isnan(got.astype(np.float32)[nan]).all()
    assert (np.signbit(got.astype(np.float32)[nan]) == np.signbit(x[nan])).all()
    assert _same_bits(got, on_cpu(lambda v: v.astype(jnp.bfloat16), x)).all()


_TYPES = [np.float32, np.float16, np.int32, np.uint32, np.int16, np.uint16, np.int8, np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", _TYPES, ids=lambda d: np.dtype(d).name)
def test_conversions_to_and_from_every_type(dtype):
    """To bfloat16 through float32 (an int32 beyond 2^24 rounds twice, as
    XLA:CPU converts it); from bfloat16 as its float32 value converts
    (saturating integers, NaN to 0)."""
    src = values(dtype, (1001,), seed=5)
    if np.dtype(dtype) == np.int32:
        src[:4] = [16842753, -16842753, 2**31 - 1, -2**31]
    x = _normal(6)
    x[:6] = _bf16([1e10, -1e10, 300.5, -129.5, 65520, 2.5])

    def f(a, b):
        return a.astype(jnp.bfloat16), b.astype(dtype)
    got = run_ipu(f, src, x)
    want = on_cpu(f, src, x)
    assert _same_bits(got[0], want[0]).all()
    assert _same_bits(got[0], src.astype(np.float32).astype(BF16)).all()
    if np.dtype(dtype).kind == "f":
        assert _same_bits(got[1], want[1]).all()
    else:
        assert (got[1] == want[1]).all()


def test_bitcasts_and_reduce_precision():
    x = _normal(7)

    def f(a):
        return (lax.bitcast_convert_type(a, jnp.uint16), lax.bitcast_convert_type(a, jnp.int16),
                lax.bitcast_convert_type(lax.bitcast_convert_type(a, jnp.uint16) ^ np.uint16(1), jnp.bfloat16),
                lax.bitcast_convert_type(a, jnp.float16), lax.reduce_precision(a, 5, 4))
    assert_matches_cpu(f, x, exact="bits", target=SMALL)


def test_transfers_keep_every_bit_and_take_two_bytes():
    ipu = jax.devices("ipu")[0]
    bits = np.arange(1 << 16, dtype=np.uint16)
    x = bits.view(ml_dtypes.bfloat16)
    on_ipu = jax.device_put(x, ipu)
    assert on_ipu.dtype == jnp.bfloat16
    assert (np.asarray(on_ipu).view(np.uint16) == bits).all()
    compiled = jax.jit(lambda v: v + v).lower(on_ipu).compile()
    assert compiled.memory_analysis().argument_size_in_bytes == 2 * x.size


def test_products_accumulate_in_float32():
    """dot_general and convolution of bfloat16: float32 products and sums
    (bfloat16 products are exact in float32), rounded once, as XLA:CPU
    upcasts them; the sums run in the plan's order, XLA:CPU's in its own."""
    rng = np.random.default_rng(1)
    a, b = _bf16(rng.standard_normal((33, 70))), _bf16(rng.standard_normal((70, 21)))
    got = run_on(jax.devices("ipu")[0], lambda p, q: p @ q, a, b)
    exact = _bf16(a.astype(np.float64) @ b.astype(np.float64))
    assert got.dtype == BF16
    assert np.abs(got.astype(np.float64) - exact.astype(np.float64)).max() <= ULP * np.abs(exact.astype(
        np.float64)).max()
    assert_matches_cpu(lambda p, q: p @ q, a, b, rtol=ULP, atol=ULP * 8)
    assert_matches_cpu(lambda p, q: jnp.matmul(p, q, preferred_element_type=jnp.float32), a, b,
                       rtol=1e-6, atol=1e-5)
    x, k = _bf16(rng.standard_normal((2, 9, 9, 3))), _bf16(rng.standard_normal((3, 3, 3, 5)))

    def conv(p, q):
        return lax.conv_general_dilated(p, q, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert_matches_cpu(conv, x, k, rtol=ULP, atol=ULP * 8)


def test_reductions_and_windows():
    """jnp.sum upcasts bfloat16 on both backends; lax.reduce sums in float32
    on the IPU (as PopLibs reduces, and as for float16), XLA:CPU rounds each
    step, so only a sum's tolerance holds; max, min, argmax are exact; a
    cumulative sum rounds every step on both."""
    rng = np.random.default_rng(2)
    x = _bf16(rng.standard_normal((8, 300)))
    assert_matches_cpu(lambda v: (jnp.max(v, 1), jnp.min(v, 0), jnp.argmax(v, 1),
                                  lax.reduce_window(v, -jnp.inf, lax.max, (2, 3), (2, 3), "VALID")),
                       x, exact=True, target=SMALL)
    assert_matches_cpu(lambda v: (jnp.sum(v, 1), jnp.mean(v, 0)), x, rtol=ULP, atol=ULP, target=SMALL)
    got = run_ipu(lambda v: lax.reduce(v, jnp.bfloat16(0), lax.add, (1,)), x)[0]
    exact = x.astype(np.float64).sum(1)
    assert np.abs(got.astype(np.float64) - exact).max() <= ULP * np.abs(x.astype(np.float64)).sum(1).max() / 8
    cumsum = run_ipu(lambda v: jnp.cumsum(v[0, :16]), x)[0]
    steps = [x[0, 0]]
    for value in x[0, 1:16]:
        steps.append(_bf16(steps[-1].astype(F32) + value.astype(F32)))
    assert _same_bits(cumsum, np.array(steps, BF16)).all()


def test_sort_gather_scatter_and_loops():
    x = _normal(8, 257)
    idx = np.array([3, 3, 200, 7, 3], np.int32)
    upd = _bf16([0.3, 0.7, -1.0, 2.5, 1e-3])

    def f(v, i, u):
        return (jnp.sort(v), jnp.argsort(v, stable=True), lax.top_k(v, 5)[0], v[i], v.at[i].add(u),
                v.at[i].max(u))
    assert_matches_cpu(f, x, idx, upd, exact=True, target=SMALL)


def test_loops_round_every_op_where_xla_cpu_may_fuse_a_multiply_add():
    """c * 1.5 + 0.25 twice from -59904: rounded after the product,
    -59904 * 1.5 = -89856 is a tie and goes to -90112 (even), and the result
    is -135168; with the product and the sum fused into one rounding
    (-89855.75 -> -89600), -134144. The IPU rounds every op, in loops as
    anywhere; XLA:CPU compiles a small while loop into one function (its
    xla_cpu_small_call path), where LLVM may contract the product into the
    sum, as it does on the host measured (docs/semantics.md)."""
    x = _bf16(np.full(8, -59904.0))

    def loop(c):
        return lax.fori_loop(0, 2, lambda _, s: s * jnp.bfloat16(1.5) + jnp.bfloat16(0.25), c)
    per_op, fused = x, x
    for _ in range(2):
        per_op = _bf16(_bf16(per_op.astype(F32) * np.float32(1.5)).astype(F32) + np.float32(0.25))
        fused = _bf16(fused.astype(np.float64) * 1.5 + 0.25)
    assert (per_op.astype(F32) == -135168).all() and (fused.astype(F32) == -134144).all()
    got = run_ipu(loop, x)[0]
    assert _same_bits(got, per_op).all()
    cpu = on_cpu(loop, x)
    assert (_same_bits(cpu, per_op) | _same_bits(cpu, fused)).all()


def test_random_bfloat16_samplers_match_the_cpu():
    key = jax.random.key(3)

    def f():
        return (jax.random.uniform(key, (1000,), jnp.bfloat16), jax.random.normal(key, (100,), jnp.bfloat16))
    got = run_on(jax.devices("ipu")[0], f)
    want = on_cpu(f)
    assert _same_bits(got[0], want[0]).all()
    assert np.abs(got[1].astype(np.float32) - want[1].astype(np.float32)).max() <= 2 * ULP * 4
