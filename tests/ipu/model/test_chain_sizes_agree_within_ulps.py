"""A float32 element-wise chain gives the same values whatever its size, to
the stated ulps: under 2^17 elements the Model's numpy kernels compute it,
above XLA:CPU's kernel (model/fast/xla_chains.py, equal to the CPU
backend's bits); subnormals are kept by small chains and flushed by large
ones (README, "What works"; docs/fuzzing.md)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
