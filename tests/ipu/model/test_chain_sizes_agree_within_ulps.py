"""A float32 element-wise chain gives the same values whatever its size, to
the stated ulps: under 2^17 elements the Model's numpy kernels compute it,
above XLA:CPU's kernel (model/fast/xla_chains.py, equal to the CPU
backend's bits); subnormals are kept by small chains and flushed by large
ones (docs/semantics.md; docs/fuzzing.md)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# At most this many ulps from the correctly rounded result: a float32
# chain under 2^17 elements runs on the Model's numpy kernels, a larger one
# on XLA:CPU's (the CPU backend's bits). Each bound holds on any x86-64
# host: numpy's float32 kernels (its own SIMD loops, SVML or libm, chosen by
# the host) stay within 4 ulp, XLA's are its own polynomials (measured on
# one host: tanh 4, expm1 6, pow 19, the others 1-2, with room for a host
# without FMA). So the two paths differ by at most the sum (docs/semantics.md;
# docs/fuzzing.md).
ULPS_FROM_ROUNDED = {  # op: (numpy kernels, XLA:CPU)
    "exp": (4, 3), "log": (4, 3), "tanh": (4, 6), "sin": (4, 3), "cos": (4, 3), "tan": (4, 3),
    "expm1": (4, 8), "log1p": (4, 4), "cbrt": (4, 3), "logistic": (4, 4), "atan2": (4, 3), "pow": (4, 32),
    "divide": (0, 0), "sqrt": (0, 0)}
_CHAINS = {"exp": lambda a, b: jnp.exp(a / 4), "log": lambda a, b: jnp.log(jnp.abs(a)), "tanh": lambda a, b: jnp.tanh(a),
           "sin": lambda a, b: jnp.sin(a), "cos": lambda a, b: jnp.cos(a), "tan": lambda a, b: jnp.tan(a),
           "expm1": lambda a, b: jnp.expm1(a / 4), "log1p": lambda a, b: jnp.log1p(jnp.abs(a)),
           "cbrt": lambda a, b: jnp.cbrt(a), "logistic": lambda a, b: jax.nn.sigmoid(a),
           "atan2": lambda a, b: jnp.arctan2(a, b), "pow": lambda a, b: jnp.power(jnp.abs(a) / 50, b),
           "divide": lambda a, b: a / b, "sqrt": lambda a, b: jnp.sqrt(jnp.abs(a))}
# The same in float64 numpy, of the float32 values each op reads (a / 4 and
# |a| / 50 are float32 steps, correctly rounded on both).
def _f64(v):
    return np.asarray(v, np.float64)


_EXACT = {"exp": lambda a, b: np.exp(_f64(a / np.float32(4))), "log": lambda a, b: np.log(np.abs(_f64(a))),
          "tanh": lambda a, b: np.tanh(_f64(a)), "sin": lambda a, b: np.sin(_f64(a)),
          "cos": lambda a, b: np.cos(_f64(a)), "tan": lambda a, b: np.tan(_f64(a)),
          "expm1": lambda a, b: np.expm1(_f64(a / np.float32(4))), "log1p": lambda a, b: np.log1p(np.abs(_f64(a))),
          "cbrt": lambda a, b: np.cbrt(_f64(a)), "logistic": lambda a, b: 1 / (1 + np.exp(-_f64(a))),
          "atan2": lambda a, b: np.arctan2(_f64(a), _f64(b)),
          "pow": lambda a, b: np.power(_f64(np.abs(a) / np.float32(50)), _f64(b)),
          "divide": lambda a, b: _f64(a) / _f64(b), "sqrt": lambda a, b: np.sqrt(np.abs(_f64(a)))}


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


@pytest.mark.parametrize("op", sorted(ULPS_FROM_ROUNDED))
def test_large_and_small_chains_stay_within_the_stated_ulps(ipu, cpu, chain_inputs, op):
    x, y = chain_inputs
    f = jax.jit(_CHAINS[op])
    large = np.asarray(f(*jax.device_put((x, y), ipu)))
    small = np.concatenate([np.asarray(f(*jax.device_put((x[i:i + 8192], y[i:i + 8192]), ipu)))
                            for i in range(0, len(x), 8192)])
    with np.errstate(all="ignore"):
        exact = _EXACT[op](x, y).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(large), np.isnan(exact))
    np.testing.assert_array_equal(np.isnan(small), np.isnan(exact))
    tiny = np.finfo(np.float32).tiny
    normal = np.isfinite(exact) & (np.abs(exact) >= tiny) & (np.abs(exact) < np.finfo(np.float32).max)
    for path, result, bound in (("numpy", small, ULPS_FROM_ROUNDED[op][0]), ("XLA", large, ULPS_FROM_ROUNDED[op][1])):
        ulps = np.abs(_ordered(result) - _ordered(exact))[normal & np.isfinite(result)]
        assert int(ulps.max(initial=0)) <= bound, (path, int(ulps.max()))
        assert np.isfinite(result[normal]).mean() > 0.999, path
    # the large path gives the CPU backend's bits (both are this host's XLA:CPU)
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
