"""float16 arithmetic rounds every step to float16, as on the IPU: cumulative
ops (so that an overflow stays infinite), sum pooling windows; reductions
still accumulate in float32. (Found by differential fuzzing, docs/fuzzing.md.)"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import run_on


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


@pytest.mark.parametrize("fn, values, want", [
    (jnp.cumprod, [60000, 2, 0.25], [60000, np.inf, np.inf]),
    (jnp.cumsum, [6e4, 6e4, -6e4], [6e4, np.inf, np.inf]),
    (lambda x: lax.cumsum(x, reverse=True), [6e4, 6e4, -6e4], [np.inf, 0, -6e4]),
])
def test_f16_cumulative_ops_round_every_step_so_an_overflow_stays_infinite(ipu, fn, values, want):
    x = np.array(values, np.float16)
    got = run_on(ipu, fn, x)
    np.testing.assert_array_equal(got, np.array(want, np.float16))      # each step rounded to f16, in order


@pytest.mark.parametrize("n", [40, 300])     # the window form, and the log-depth scan of long axes
def test_f16_cumsum_matches_per_step_float16_rounding(ipu, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3000).astype(np.float16)
    x[n // 2] = 65000
    got, in_order = run_on(ipu, jnp.cumsum, x), _f16_in_order(x, np.add)
    if n == 40:     # the window form adds in order, each step rounded to f16
        np.testing.assert_array_equal(got, in_order)
    # The scan of a long axis adds in a tree order: where a partial sum
    # overflows may differ (accumulation order, docs/fuzzing.md); elsewhere
    # the sums agree with the in-order ones within f16 rounding.
    finite = np.isfinite(in_order) & np.isfinite(got)
    assert finite[:n // 2].all()
    np.testing.assert_allclose(got[finite].astype(np.float32), in_order[finite].astype(np.float32), rtol=2e-2,
                               atol=64)


def test_f16_sum_pooling_windows_round_in_f16_and_reductions_still_accumulate_in_f32(ipu):
    x = np.array([[6e4, 6e4, -6e4, 1.0]], np.float16)
    window = lambda v: lax.reduce_window(v, np.float16(0), lax.add, (1, 3), (1, 1), "VALID")
    np.testing.assert_array_equal(run_on(ipu, window, x), np.array([[np.inf, 1.0]], np.float16))
    # a reduce of f16 (not a window) keeps PopLibs' fp32 accumulator
    total = lambda v: lax.reduce(v, np.float16(0), lax.add, (1,))
    np.testing.assert_array_equal(run_on(ipu, total, x), np.array([6e4 + 1], np.float16))
