"""The order in which a long cumulative op combines its terms
(docs/semantics.md, "Cumulative ops"): on an axis of n elements with
x.size * n > 65,536 the IPU runs JAX's log-depth associative scan (aligned
pairs, fours, ... first), not the sequential order, so an intermediate may
overflow where the running product does not: a float16 cumprod of 1,000
values gives NaN (inf * 0) where the step-by-step product gives -0.0.

The orders are modelled in numpy (sequential: multiply.accumulate, each
step rounded) and by JAX's own associative_scan run op by op (each float16
multiply correctly rounded on any host), never by XLA:CPU's bits."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import run_on
from jax_ipu.frontend import jax_rules


def _sequential(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.multiply.accumulate(x, dtype=x.dtype)


def _scan_order(x: np.ndarray) -> np.ndarray:
    """JAX's associative_scan, one op at a time on the CPU (no fusion, so
    every product is rounded to x's type)."""
    with jax.disable_jit(), jax.default_device(jax.devices("cpu")[0]):
        return np.asarray(jax.lax.associative_scan(jnp.multiply, jnp.asarray(x)))


def _row(n: int, dtype, zero: int) -> np.ndarray:
    """Ones, with four small factors then four large ones at an aligned
    place (their product overflows, the running product stays at most the
    large factor; the small ones' product is a normal number), a -1 and
    later a 0."""
    small, large = {np.float16: (2.0 ** -3, 2.0 ** 4), np.float32: (2.0 ** -30, 2.0 ** 32)}[dtype]
    x = np.ones(n, dtype)
    x[96:100], x[100:104] = small, large
    x[150], x[zero] = -1, 0
    return x


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_a_long_cumprod_follows_the_scan_order_where_an_intermediate_overflows(ipu, dtype):
    n = 1000
    assert n * n > jax_rules._CUMULATIVE_WINDOW_LIMIT         # the scan, not the window form
    x = _row(n, dtype, 700)
    sequential, scan = _sequential(x), _scan_order(x)
    assert np.isfinite(sequential).all() and sequential[700] == 0 and np.signbit(sequential[-1])   # -0.0 to the end
    assert np.isinf(scan[103]) and np.isnan(scan[700:]).all()                                  # the four overflow
    got = run_on(ipu, jnp.cumprod, x)
    np.testing.assert_array_equal(got, scan)
    assert np.isnan(got[-1]) and not np.isnan(sequential[-1])


def test_a_short_cumprod_stays_finite_where_the_running_product_does(ipu):
    # The window form (x.size * n <= 65,536) reduces each prefix in chunks,
    # each in order: here no chunk holds all four large factors.
    x = _row(256, np.float16, 200)
    assert 256 * 256 <= jax_rules._CUMULATIVE_WINDOW_LIMIT
    got = run_on(ipu, jnp.cumprod, x)
    np.testing.assert_array_equal(got[:200], _sequential(x)[:200])
    assert np.isfinite(got[:200]).all()
