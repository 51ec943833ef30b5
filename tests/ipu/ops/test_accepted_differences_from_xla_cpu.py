"""Where the IPU's values differ from XLA:CPU's on purpose, pinned
(docs/fuzzing.md, "accepted differences"): the IPU rounds a product before
adding it where XLA:CPU fuses a multiply-add, rounds every float16 op where
XLA:CPU keeps a fusion in float32, keeps float32 subnormals XLA:CPU
flushes, divides correctly rounded, and may give a zero of either sign as
the maximum of two zeros."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from helpers import on_cpu, run_on


def _one_of(got: np.ndarray, *models: np.ndarray) -> bool:
    """Whether each element of `got` (XLA:CPU's) equals that of one of the
    models, NaN equal to NaN: what a test may say of XLA:CPU's bits, which
    depend on the host's instruction set (float16 arithmetic, fused
    multiply-adds, vector widths)."""
    got = np.asarray(got)
    match = np.zeros(got.shape, bool)
    for model in models:
        model = np.asarray(model, got.dtype)
        match |= (got == model) | (np.isnan(got) & np.isnan(model)) if got.dtype.kind == "f" else got == model
    return bool(match.all())


def _fused_multiply_add(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c for float32 arrays with one rounding (a fused multiply-add):
    the product is exact in float64, and the float64 sum's rounding error
    (TwoSum) breaks the ties its second rounding to float32 would get wrong."""
    p = a.astype(np.float64) * b
    s = p + c
    bp = s - c
    err = (p - bp) + (c - (s - bp))
    rounded = s.astype(np.float32)
    # A float64 sum exactly halfway between two float32 values, with an error
    # that says on which side the exact sum lies: round towards it.
    up, down = np.nextafter(rounded, np.float32(np.inf)), np.nextafter(rounded, np.float32(-np.inf))
    tie_up = (s == (rounded.astype(np.float64) + up) / 2) & (err > 0)
    tie_down = (s == (rounded.astype(np.float64) + down) / 2) & (err < 0)
    return np.where(tie_up, up, np.where(tie_down, down, rounded))

def test_accepted_the_ipu_rounds_a_product_before_adding_where_xla_cpu_may_fuse_a_multiply_add(ipu, cpu):
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))
    f = jax.jit(lambda a, b, c: a * b + c)
    rounded_twice, fused = a * b + c, _fused_multiply_add(a, b, c)
    assert (rounded_twice != fused).sum() > 100            # the two models differ, often
    np.testing.assert_array_equal(np.asarray(f(*jax.device_put((a, b, c), ipu))), rounded_twice)
    # XLA:CPU contracts it where the host has FMA instructions (its bits are the host's).
    assert _one_of(np.asarray(f(*jax.device_put((a, b, c), cpu))), rounded_twice, fused)


def test_accepted_the_ipu_rounds_every_f16_op_where_xla_cpu_may_keep_a_fusion_in_f32(ipu, cpu):
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal(4096).astype(np.float16) for _ in range(3))
    f = jax.jit(lambda a, b, c: a * b + c)
    every_op = a * b + c                                                   # numpy rounds each f16 op
    in_f32 = (a.astype(np.float32) * b + c).astype(np.float16)             # a fusion's f32 intermediates
    once = (a.astype(np.float64) * b + c).astype(np.float16)               # one rounding (exact in f64)
    assert (every_op != in_f32).sum() > 100
    np.testing.assert_array_equal(np.asarray(f(*jax.device_put((a, b, c), ipu))), every_op)
    # XLA:CPU's choice depends on the host's float16 instructions.
    assert _one_of(np.asarray(f(*jax.device_put((a, b, c), cpu))), every_op, in_f32, once)


def test_accepted_f32_subnormal_inputs_are_read_as_themselves_on_the_ipu_and_as_zero_on_xla_cpu(ipu):
    x = np.array([1e-40, -1e-40, 3e-39], np.float32)
    f = lambda v: (jnp.log(jnp.abs(v)), v > 0, jnp.sqrt(jnp.abs(v)))
    log_ipu, pos_ipu, sqrt_ipu = run_on(ipu, f, x)
    log_cpu, pos_cpu, sqrt_cpu = on_cpu(f, x)
    np.testing.assert_allclose(log_ipu, np.log(np.abs(x).astype(np.float64)), rtol=1e-6)
    np.testing.assert_array_equal(pos_ipu, [True, False, True])
    np.testing.assert_allclose(sqrt_ipu, np.sqrt(np.abs(x).astype(np.float64)), rtol=1e-6)
    # XLA:CPU's kernels may read them as zeros (DAZ): each element is the
    # subnormal's or zero's
    assert _one_of(pos_cpu, pos_ipu, np.zeros(3, bool))
    assert _one_of(sqrt_cpu, sqrt_ipu, np.zeros(3, np.float32))


def test_accepted_f32_division_on_the_ipu_is_correctly_rounded(ipu):
    rng = np.random.default_rng(5)
    a = (rng.standard_normal(8192) * 10.0 ** rng.integers(-30, 30, 8192)).astype(np.float32)
    b = (rng.standard_normal(8192) * 10.0 ** rng.integers(-30, 30, 8192)).astype(np.float32)
    got = run_on(ipu, lambda a, b: a / b, a, b)
    np.testing.assert_array_equal(got, (a.astype(np.float64) / b).astype(np.float32))


def test_accepted_the_maximum_of_two_zeros_is_a_zero_of_either_sign(ipu):
    for a, b in [(-0.0, 0.0), (0.0, -0.0)]:
        got = run_on(ipu, jnp.maximum, np.float32(a), np.float32(b))
        assert got == 0
        assert np.signbit(got) == np.signbit(np.maximum(np.float32(a), np.float32(b)))    # numpy's choice


def test_accepted_f16_sums_of_a_reduce_accumulate_in_f32(ipu):
    x = np.array([6e4, 6e4, -6e4], np.float16)
    total = lambda v: lax.reduce(v, np.float16(0), lax.add, (0,))
    assert run_on(ipu, total, x) == np.float16(6e4)      # f32 partials, as PopLibs' reduce


def test_accepted_f32_subnormal_results_are_kept_on_the_ipu_and_flushed_on_xla_cpu(ipu):
    x = np.array([1e-20, 1e-20, 1e20], np.float32)
    f = lambda v: (jnp.cumprod(v), v[0] * v[1])
    (prefix_ipu, product_ipu), (prefix_cpu, product_cpu) = run_on(ipu, f, x), on_cpu(f, x)
    np.testing.assert_allclose(prefix_ipu, [1e-20, 1e-40, 1e-20], rtol=1e-3)   # the subnormal kept, and used
    np.testing.assert_allclose(product_ipu, 1e-40, rtol=1e-3)
    flushed = np.array([1e-20, 0, 0], np.float32)                             # (FTZ)
    assert _one_of(prefix_cpu, prefix_ipu, flushed) and _one_of(product_cpu, product_ipu, 0)


def test_accepted_division_by_a_constant_with_a_subnormal_reciprocal_is_ieee_on_the_ipu(ipu):
    """XLA:CPU divides by a constant as a multiply by its reciprocal, here
    subnormal and flushed: x / -3.4e38 is -0.0 and -inf / -3.4e38 NaN. The
    IPU divides (IEEE)."""
    x = np.array([-np.inf, 1.0, 2.1e35], np.float32)
    f = lambda v: v / np.float32(-3.4028234663852886e38)
    want = (x.astype(np.float64) / -3.4028234663852886e38).astype(np.float32)
    np.testing.assert_array_equal(run_on(ipu, f, x), want)
    by_flushed_reciprocal = x * np.float32(-0.0)       # 1 / -3.4e38 is subnormal, -0.0 flushed; -inf * -0.0 NaN
    assert _one_of(on_cpu(f, x), want, by_flushed_reciprocal)


def test_accepted_an_f16_intermediate_that_overflows_is_inf_on_the_ipu(ipu):
    """The IPU rounds every f16 op, so x * x overflows before the sqrt;
    XLA:CPU keeps the fusion's intermediate in f32 (seed 104290)."""
    x = np.array([-15840.0, 3.0], np.float16)
    f = lambda v: jnp.sqrt(lax.integer_pow(v, 2))
    every_op = np.sqrt(x * x)                                                    # [inf, 3]
    in_f32 = np.sqrt(x.astype(np.float32) ** 2).astype(np.float16)              # [15840, 3]
    np.testing.assert_array_equal(every_op, np.array([np.inf, 3.0], np.float16))
    np.testing.assert_array_equal(run_on(ipu, f, x), every_op)
    assert _one_of(on_cpu(f, x), every_op, in_f32)
    barrier = lambda v: jnp.sqrt(lax.optimization_barrier(lax.integer_pow(v, 2)))   # rounded to f16 between
    np.testing.assert_array_equal(on_cpu(barrier, x), every_op)
