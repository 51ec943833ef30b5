"""Accepted differences the threshold-sized fuzz runs met (docs/fuzzing.md),
each shown against numpy models of the two behaviours: the IPU's side is
asserted, XLA:CPU's only as "one of the models" (its bits depend on the
host's vector width and instructions)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import on_cpu, run_on


def _one_of(got, *models) -> bool:
    got = np.asarray(got)
    match = np.zeros(got.shape, bool)
    for model in models:
        model = np.asarray(model, got.dtype)
        match |= (got == model) | (np.isnan(got) & np.isnan(model))
    return bool(match.all())


@pytest.mark.parametrize("n", [100, 4096, 1 << 17])
@pytest.mark.parametrize("reduction", ["max", "min", "window"])
def test_max_and_min_reductions_keep_a_nan_on_the_ipu(ipu, n, reduction):
    """XLA's max and min propagate NaN, as numpy's do; XLA:CPU's vectorised
    reductions may drop it (openxla/xla#21461: seen from 4,096 elements on
    one host), the IPU keeps it."""
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    x[n // 3] = np.nan
    f = {"max": jnp.max, "min": jnp.min,
         "window": lambda v: lax.reduce_window(v, -np.inf, lax.max, (n // 4,), (n // 4,), "VALID")}[reduction]
    with_nan = {"max": np.max, "min": np.min,
                "window": lambda v: v.reshape(4, -1)[:, :n // 4].max(axis=1)}[reduction]
    without_nan = {"max": np.nanmax, "min": np.nanmin,
                   "window": lambda v: np.nanmax(v.reshape(4, -1)[:, :n // 4], axis=1)}[reduction]
    got = run_on(ipu, f, x)
    np.testing.assert_array_equal(got, with_nan(x))
    assert np.isnan(got).any()
    assert _one_of(on_cpu(f, x), with_nan(x), without_nan(x))


def test_an_overflow_in_a_sum_is_decided_by_the_order_of_its_terms(ipu):
    """max + max overflows to inf, and inf + -inf is NaN; added in another
    order, max + -inf is -inf. Both are IEEE sums of the same terms: which
    one comes out is the plan's order (accumulation order, docs/fuzzing.md)."""
    big = np.finfo(np.float32).max
    x = np.array([[big, big, -np.inf], [-np.inf, big, big]], np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        in_order = (x[:, 0] + x[:, 1]) + x[:, 2]               # [nan, -inf]
        paired_last = x[:, 0] + (x[:, 1] + x[:, 2])            # [-inf, nan]
    assert not _one_of(in_order, paired_last)
    total = lambda v: lax.reduce(v, np.float32(0), lax.add, (1,))
    got = run_on(ipu, total, x)
    assert _one_of(got, in_order, paired_last) and not np.isfinite(got).any()
    assert _one_of(on_cpu(total, x), in_order, paired_last, -np.inf)


def test_clamp_of_a_zero_to_a_zero_bound_gives_a_zero_of_either_sign(ipu):
    """clamp is a max then a min: of -0.0 and a bound of +0.0 either zero may
    come out, as for max and min (semantics.md)."""
    x = np.array([-0.0, 0.0, -3.0, 5.0, -1e-45], np.float32)
    f = lambda v: lax.clamp(np.float32(-2.0), v, np.float32(0.0))
    got = run_on(ipu, f, x)
    np.testing.assert_array_equal(got, np.array([0.0, 0.0, -2.0, 0.0, -1e-45], np.float32))   # equal as numbers
    assert not np.signbit(got[1]) and not np.signbit(got[3])               # +0.0 bounds give +0.0
    assert _one_of(on_cpu(f, x), got, [-0.0, 0.0, -2.0, 0.0, -0.0])
