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


def test_accepted_the_ipu_rounds_a_product_before_adding_where_xla_cpu_fuses_a_multiply_add(ipu, cpu):
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))
    f = jax.jit(lambda a, b, c: a * b + c)
    np.testing.assert_array_equal(np.asarray(f(*jax.device_put((a, b, c), ipu))), a * b + c)
    fused = (a.astype(np.float64) * b + c).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(f(*jax.device_put((a, b, c), cpu))), fused)   # why they differ


def test_accepted_the_ipu_rounds_every_f16_op_where_xla_cpu_keeps_a_fusion_in_f32(ipu, cpu):
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal(4096).astype(np.float16) for _ in range(3))
    f = jax.jit(lambda a, b, c: a * b + c)
    np.testing.assert_array_equal(np.asarray(f(*jax.device_put((a, b, c), ipu))), a * b + c)
    wide = (a.astype(np.float32) * b + c).astype(np.float16)
    np.testing.assert_array_equal(np.asarray(f(*jax.device_put((a, b, c), cpu))), wide)


def test_accepted_f32_subnormal_inputs_are_read_as_themselves_on_the_ipu_and_as_zero_on_xla_cpu(ipu):
    x = np.array([1e-40, -1e-40, 3e-39], np.float32)
    f = lambda v: (jnp.log(jnp.abs(v)), v > 0, jnp.sqrt(jnp.abs(v)))
    log_ipu, pos_ipu, sqrt_ipu = run_on(ipu, f, x)
    log_cpu, pos_cpu, sqrt_cpu = on_cpu(f, x)
    np.testing.assert_allclose(log_ipu, np.log(np.abs(x).astype(np.float64)), rtol=1e-6)
    np.testing.assert_array_equal(pos_ipu, [True, False, True])
    np.testing.assert_allclose(sqrt_ipu, np.sqrt(np.abs(x).astype(np.float64)), rtol=1e-6)
    # XLA:CPU's kernels read them as zeros (DAZ): no element is positive,
    # and log's values are not the subnormals' (-inf, or its fast log's own)
    assert not pos_cpu.any() and np.all(sqrt_cpu == 0) and not np.isclose(log_cpu, log_ipu).any()


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
    np.testing.assert_array_equal(prefix_cpu, np.array([1e-20, 0, 0], np.float32))
    assert product_cpu == 0


def test_accepted_division_by_a_constant_with_a_subnormal_reciprocal_is_ieee_on_the_ipu(ipu):
    """XLA:CPU divides by a constant as a multiply by its reciprocal, here
    subnormal and flushed: x / -3.4e38 is -0.0 and -inf / -3.4e38 NaN. The
    IPU divides (IEEE)."""
    x = np.array([-np.inf, 1.0, 2.1e35], np.float32)
    f = lambda v: v / np.float32(-3.4028234663852886e38)
    want = (x.astype(np.float64) / -3.4028234663852886e38).astype(np.float32)
    np.testing.assert_array_equal(run_on(ipu, f, x), want)
    assert np.isnan(on_cpu(f, x)[0]) and on_cpu(f, x)[2] == 0


def test_accepted_an_f16_intermediate_that_overflows_is_inf_on_the_ipu(ipu):
    """The IPU rounds every f16 op, so x * x overflows before the sqrt;
    XLA:CPU keeps the fusion's intermediate in f32 (seed 104290)."""
    x = np.array([-15840.0, 3.0], np.float16)
    f = lambda v: jnp.sqrt(lax.integer_pow(v, 2))
    np.testing.assert_array_equal(run_on(ipu, f, x), np.array([np.inf, 3.0], np.float16))
    np.testing.assert_array_equal(on_cpu(f, x), np.array([15840.0, 3.0], np.float16))
    barrier = lambda v: jnp.sqrt(lax.optimization_barrier(lax.integer_pow(v, 2)))   # rounded to f16 between
    np.testing.assert_array_equal(on_cpu(barrier, x), run_on(ipu, f, x))
