"""What differential fuzzing against XLA:CPU found (issue 28), each pinned:
f16 cumulative ops, the sign of a K = 1 product's zero, memory checked at
device_put, Ctrl-C cancelling device runs, the bound on
JAX_IPU_DEVICE_COUNT, host MemoryError as RESOURCE_EXHAUSTED, and the
element-wise chains whose results depend on the array's size."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import on_cpu, run_on, run_python


def _f16_in_order(x: np.ndarray, op) -> np.ndarray:
    """The prefix op of x, each step rounded to float16 (numpy's f16 ufunc
    calls round every result)."""
    out = np.empty_like(x)
    acc = x[0]
    out[0] = acc
    for i in range(1, len(x)):
        acc = op(acc, x[i])
        out[i] = acc
    return out


# ---------------------------------------------------------------- 1. f16 cumulative ops

@pytest.mark.parametrize("fn, values, want", [
    (jnp.cumprod, [60000, 2, 0.25], [60000, np.inf, np.inf]),
    (jnp.cumsum, [6e4, 6e4, -6e4], [6e4, np.inf, np.inf]),
    (lambda x: lax.cumsum(x, reverse=True), [6e4, 6e4, -6e4], [np.inf, 0, -6e4]),
])
def test_f16_cumulative_ops_round_every_step_so_an_overflow_stays_infinite(ipu, fn, values, want):
    x = np.array(values, np.float16)
    got = run_on(ipu, fn, x)
    np.testing.assert_array_equal(got, np.array(want, np.float16))
    np.testing.assert_array_equal(got, on_cpu(fn, x))


@pytest.mark.parametrize("n", [40, 300])     # the window form, and the log-depth scan of long axes
def test_f16_cumsum_matches_per_step_float16_rounding(ipu, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3000).astype(np.float16)
    x[n // 2] = 65000
    got, cpu = run_on(ipu, jnp.cumsum, x), on_cpu(jnp.cumsum, x)
    # XLA:CPU adds a long window in a tree order, so where a partial sum
    # overflows differs (accumulation order, docs/fuzzing.md); elsewhere
    # the sums agree within f16 rounding.
    finite = np.isfinite(cpu) & np.isfinite(got)
    np.testing.assert_allclose(got[finite].astype(np.float32), cpu[finite].astype(np.float32), rtol=2e-2, atol=64)
    if n == 40:     # the window form adds in order, each step rounded to f16
        np.testing.assert_array_equal(got, _f16_in_order(x, np.add))


def test_f16_sum_pooling_windows_round_in_f16_and_reductions_still_accumulate_in_f32(ipu):
    x = np.array([[6e4, 6e4, -6e4, 1.0]], np.float16)
    window = lambda v: lax.reduce_window(v, np.float16(0), lax.add, (1, 3), (1, 1), "VALID")
    np.testing.assert_array_equal(run_on(ipu, window, x), on_cpu(window, x))
    np.testing.assert_array_equal(run_on(ipu, window, x), np.array([[np.inf, 1.0]], np.float16))
    # a reduce of f16 (not a window) keeps PopLibs' fp32 accumulator
    total = lambda v: lax.reduce(v, np.float16(0), lax.add, (1,))
    np.testing.assert_array_equal(run_on(ipu, total, x), np.array([6e4 + 1], np.float16))


# ---------------------------------------------------------------- 2. the sign of a product's zero

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_product_over_one_term_keeps_the_sign_of_zero(ipu, dtype):
    a, b = np.array([[-0.0], [0.0], [-2.0]], dtype), np.array([[1.0, -0.0, 3.0]], dtype)
    got, want = run_on(ipu, jnp.matmul, a, b), on_cpu(jnp.matmul, a, b)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert np.signbit(got[0, 0]) and np.signbit(got[1, 1]) and not np.signbit(got[2, 1])


def test_a_product_over_one_term_in_a_wider_type_and_batched(ipu):
    rng = np.random.default_rng(1)
    a, b = rng.integers(-128, 128, (3, 4, 1)).astype(np.int8), rng.integers(-128, 128, (3, 1, 5)).astype(np.int8)
    f = lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,))), preferred_element_type=np.int32)
    np.testing.assert_array_equal(run_on(ipu, f, a, b), on_cpu(f, a, b))
    h = np.array([[-0.0], [3.0]], np.float16)
    g = lambda a, b: jnp.matmul(a, b, preferred_element_type=np.float32)
    got = run_on(ipu, g, h, np.array([[1.0]], np.float16))
    assert got.dtype == np.float32 and np.signbit(got[0, 0]) and got[1, 0] == 3.0


def test_a_sum_of_negative_zero_products_is_positive_zero_on_both_backends(ipu):
    """Accepted (docs/fuzzing.md): over K > 1 both backends start the sum
    from +0.0, so products that are all -0.0 sum to +0.0 (IEEE: -0.0)."""
    a, b = -np.zeros((2, 3), np.float32), np.ones((3, 2), np.float32)
    got, want = run_on(ipu, jnp.matmul, a, b), on_cpu(jnp.matmul, a, b)
    assert not np.signbit(got).any() and not np.signbit(want).any()


# ---------------------------------------------------------------- 3. memory checked at device_put

def test_device_put_beyond_the_free_memory_fails_at_once_naming_the_sizes():
    result = run_python("""
import jax, numpy as np
ipu = jax.devices('ipu')[0]
limit = ipu.memory_stats()['bytes_limit']
kept = jax.device_put(np.ones(limit // 8, np.float32), ipu)        # half the memory
try:
    jax.device_put(np.ones(limit // 8 + 1024, np.float32), ipu)    # more than the other half
    print('ACCEPTED')
except Exception as e:
    print('ERROR', e)
print('IN USE', ipu.memory_stats()['bytes_in_use'] == limit // 2)
kept.delete()
x = jax.device_put(np.ones(limit // 8 + 1024, np.float32), ipu)    # fits once the first is gone
print('FITS', float(jax.jit(lambda v: v[0] + 1)(x)))
""", JAX_IPU_MODEL_NUM_TILES="8")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ACCEPTED" not in out, out
    assert "ERROR RESOURCE_EXHAUSTED: device_put of float32[" in out and "bytes are in use" in out, out
    assert "IN USE True" in out and "FITS 2.0" in out, out


def test_copies_between_ipus_are_checked_too():
    result = run_python("""
import jax, numpy as np
a, b = jax.devices('ipu')[:2]
limit = b.memory_stats()['bytes_limit']
full = jax.device_put(np.ones(limit // 4 - 256, np.float32), b)
x = jax.device_put(np.ones(1024, np.float32), a)
try:
    jax.device_put(x, b)
    print('ACCEPTED')
except Exception as e:
    print('ERROR', e)
""", JAX_IPU_MODEL_NUM_TILES="8", JAX_IPU_DEVICE_COUNT="2")
    assert result.returncode == 0, result.stderr
    assert "ERROR RESOURCE_EXHAUSTED: a copy from IPU 0" in result.stdout, result.stdout


# ---------------------------------------------------------------- 4. Ctrl-C cancels device runs

def test_ctrl_c_cancels_a_long_loop_on_the_ipu_at_its_next_iteration():
    result = run_python("""
import os, signal, time
# Python's own handler, as at a terminal: a job started in the background
# by a shell without job control inherits SIGINT ignored, and keeps it so.
signal.signal(signal.SIGINT, signal.default_int_handler)
import jax, numpy as np
from jax import lax
ipu = jax.devices('ipu')[0]
f = jax.jit(lambda x: lax.fori_loop(0, 2_000_000, lambda i, c: c * 1.0001 + 1, x))
g = jax.jit(lambda x: x + 1)
x = jax.device_put(np.zeros(4, np.float32), ipu)
g(x).block_until_ready()
y = f(x)                      # runs on the IPU's worker for tens of seconds
try:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
except KeyboardInterrupt:
    print('INTERRUPTED')
t = time.perf_counter()
print('NEXT', np.asarray(g(x)).tolist(), time.perf_counter() - t)
try:
    np.asarray(y)
    print('LOOP FINISHED')
except Exception as e:
    print('LOOP', e)
""")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert "INTERRUPTED" in result.stdout, result.stdout
    assert lines["NEXT"].startswith("[1.0, 1.0, 1.0, 1.0]"), result.stdout
    assert float(lines["NEXT"].split()[-1]) < 5.0, result.stdout      # not the loop's remaining time
    assert lines["LOOP"].startswith("CANCELLED:") and "KeyboardInterrupt" in lines["LOOP"], result.stdout


def test_runs_started_after_a_cancel_run_to_the_end(ipu):
    from jax_ipu.model.engine import cancel_runs
    f = jax.jit(lambda x: lax.fori_loop(0, 50, lambda i, c: c + 1, x))
    x = jax.device_put(np.zeros(3, np.float32), ipu)
    cancel_runs()
    np.testing.assert_array_equal(np.asarray(f(x)), np.full(3, 50.0))


# ---------------------------------------------------------------- 5. JAX_IPU_DEVICE_COUNT bounded

def test_an_impossible_device_count_is_refused_at_once_saying_the_limit():
    code = ("import time, jax\nt = time.perf_counter()\ntry:\n    jax.devices('ipu')\n    print('CREATED')\n"
            "except Exception as e:\n    print('ERROR', e)\nprint('SECONDS', time.perf_counter() - t)\n")
    result = run_python(code, JAX_IPU_DEVICE_COUNT="100000")
    assert result.returncode == 0, result.stderr
    assert "ERROR" in result.stdout and "JAX_IPU_DEVICE_COUNT='100000': at most 256" in result.stdout, result.stdout
    assert float(result.stdout.split("SECONDS")[1]) < 10
    result = run_python(code, JAX_IPU_DEVICE_COUNT="257")
    assert "at most 256" in result.stdout, result.stdout


# ---------------------------------------------------------------- 6. host MemoryError

def test_a_host_memory_error_in_a_transfer_is_resource_exhausted(ipu, monkeypatch):
    from jax_ipu.pjrt import client

    def no_memory(array, spec):
        raise MemoryError("Unable to allocate 3.64 TiB for an array")
    monkeypatch.setattr(client, "to_device", no_memory)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"^RESOURCE_EXHAUSTED: MemoryError: Unable to allocate"):
        jax.device_put(np.ones(8, np.float32), ipu)


def test_a_huge_stride_0_view_is_refused_before_the_host_copies_it(ipu):
    view = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(10 ** 12,), strides=(0,))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"^RESOURCE_EXHAUSTED: device_put of float32\[1000000000000\]"):
        jax.device_put(view, ipu)


def test_a_memory_error_while_running_is_resource_exhausted(ipu, monkeypatch):
    from jax_ipu.pjrt import client
    engine = client.CURRENT.device(ipu.id).engine
    f = jax.jit(lambda x: lax.fori_loop(0, 3, lambda i, c: c + 1, x))    # runs on the worker
    x = jax.device_put(np.zeros(2, np.float32), ipu)
    f(x).block_until_ready()

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 1.00 TiB")
    monkeypatch.setattr(engine, "run", no_memory)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"^RESOURCE_EXHAUSTED: MemoryError"):
        np.asarray(f(x))


# ---------------------------------------------------------------- 7. size-dependent element-wise chains

# At most this many ulps between a float32 result of a chain under 2^17
# elements (the Model's numpy kernels) and the same element of a larger
# chain (XLA:CPU's kernel, equal to the CPU backend's bits), measured over
# the inputs below (README, "What works"; docs/fuzzing.md).
ULPS_BETWEEN_PATHS = {"exp": 2, "log": 3, "tanh": 4, "sin": 1, "cos": 1, "tan": 3, "expm1": 6, "log1p": 3,
                      "cbrt": 2, "logistic": 4, "atan2": 3, "pow": 19, "divide": 0, "sqrt": 0}
_CHAINS = {"exp": lambda a, b: jnp.exp(a / 4), "log": lambda a, b: jnp.log(jnp.abs(a)), "tanh": lambda a, b: jnp.tanh(a),
           "sin": lambda a, b: jnp.sin(a), "cos": lambda a, b: jnp.cos(a), "tan": lambda a, b: jnp.tan(a),
           "expm1": lambda a, b: jnp.expm1(a / 4), "log1p": lambda a, b: jnp.log1p(jnp.abs(a)),
           "cbrt": lambda a, b: jnp.cbrt(a), "logistic": lambda a, b: jax.nn.sigmoid(a),
           "atan2": lambda a, b: jnp.arctan2(a, b), "pow": lambda a, b: jnp.power(jnp.abs(a) / 50, b),
           "divide": lambda a, b: a / b, "sqrt": lambda a, b: jnp.sqrt(jnp.abs(a))}


def _ordered(a: np.ndarray) -> np.ndarray:
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


@pytest.fixture(scope="module")
def chain_inputs():
    rng = np.random.default_rng(0)
    n = 1 << 17
    x = np.concatenate([rng.uniform(-100, 100, n // 2),
                        rng.standard_normal(n // 2) * 10.0 ** rng.integers(-8, 9, n // 2)]).astype(np.float32)
    return x, (rng.standard_normal(n) * 3).astype(np.float32)


@pytest.mark.parametrize("op", sorted(ULPS_BETWEEN_PATHS))
def test_large_and_small_chains_agree_within_the_stated_ulps(ipu, cpu, chain_inputs, op):
    x, y = chain_inputs
    f = jax.jit(_CHAINS[op])
    large = np.asarray(f(*jax.device_put((x, y), ipu)))
    small = np.concatenate([np.asarray(f(*jax.device_put((x[i:i + 8192], y[i:i + 8192]), ipu)))
                            for i in range(0, len(x), 8192)])
    np.testing.assert_array_equal(np.isnan(large), np.isnan(small))
    finite = np.isfinite(large) & np.isfinite(small)
    np.testing.assert_array_equal(large[~finite & ~np.isnan(large)], small[~finite & ~np.isnan(large)])
    tiny = np.finfo(np.float32).tiny
    normal = finite & (np.abs(large) >= tiny) & (np.abs(small) >= tiny)
    assert int(np.abs(_ordered(large) - _ordered(small))[normal].max(initial=0)) <= ULPS_BETWEEN_PATHS[op]
    # the large path gives the CPU backend's bits
    np.testing.assert_array_equal(large.view(np.int32), np.asarray(f(*jax.device_put((x, y), cpu))).view(np.int32))


def test_subnormals_are_kept_by_small_chains_and_flushed_by_large_ones(ipu):
    """Accepted (docs/fuzzing.md): a float32 chain of 2^17 elements or more
    holding a transcendental op or a division runs on XLA:CPU, which treats
    subnormal inputs as zero and flushes subnormal results, as the CPU
    backend does; smaller chains keep them."""
    f = jax.jit(lambda v: (jnp.log(v), jnp.exp(v - 100.0)))
    n = 1 << 17
    small_in = np.full(1024, 1e-40, np.float32)
    large_in = np.full(n, 1e-40, np.float32)
    log_small, exp_small = (np.asarray(a) for a in f(jax.device_put(small_in, ipu)))
    log_large, exp_large = (np.asarray(a) for a in f(jax.device_put(large_in, ipu)))
    np.testing.assert_allclose(log_small, np.log(np.float64(1e-40)), rtol=1e-6)     # the subnormal read as such
    assert np.all(log_large == -np.inf)                                             # read as zero
    np.testing.assert_allclose(exp_small, np.exp(np.float64(-100.0)), rtol=0.05)    # a subnormal result kept
    assert np.all(exp_large == 0)                                                   # flushed


# ---------------------------------------------------------------- accepted differences (docs/fuzzing.md)

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
