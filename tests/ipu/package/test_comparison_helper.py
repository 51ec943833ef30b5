"""helpers.assert_matches_cpu, the tests' one comparison with XLA:CPU:
it passes what matches and fails, naming the leaf and the worst element,
what does not. Wrong results are handed in as got=, beside one real run."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import SMALL, TOLERANCE, assert_matches_cpu, on_cpu


def f(x, i):
    return {"a": jnp.sin(x), "b": (i * 2, x > 0)}


X = np.linspace(-2, 2, 7, dtype=np.float32)
I = np.arange(7, dtype=np.int32)


def wrong(leaf: str, index: int, value):
    """XLA:CPU's results of f with one element changed."""
    got = jax.tree.map(np.array, on_cpu(f, X, I))          # writable copies
    array = got["a"] if leaf == "a" else got["b"][0]
    array[index] = value
    return got


def test_matching_results_pass_and_are_returned():
    got = assert_matches_cpu(f, X, I)
    np.testing.assert_array_equal(got["b"][0], I * 2)
    got = assert_matches_cpu(f, X, I, target=SMALL)          # the Engine's flat list
    assert len(got) == 3


def test_a_float_beyond_the_tolerance_names_its_leaf_and_element():
    got = wrong("a", 3, np.float32(0.5))                     # sin(0) is 0
    with pytest.raises(AssertionError, match=r"\['a'\] \(float32\[7\]\): 1 of 7 elements .*index \(3,\): "
                                             r"IPU .*0\.5.*XLA:CPU .*0\.0"):
        assert_matches_cpu(f, X, I, got=got)
    # ... and passes within a tolerance stated for it.
    assert_matches_cpu(f, X, I, got=got, atol=0.6)


def test_integers_are_exact_whatever_the_tolerance():
    got = wrong("b", 2, 5)
    with pytest.raises(AssertionError, match=r"\['b'\]\[0\] .*not equal to.*index \(2,\)"):
        assert_matches_cpu(f, X, I, got=got, rtol=1.0, atol=10.0)


def test_nan_and_infinities_must_be_where_the_cpu_has_them():
    with pytest.raises(AssertionError, match=r"\['a'\].*index \(1,\): IPU .*nan"):
        assert_matches_cpu(f, X, I, got=wrong("a", 1, np.nan), atol=1e3)

    def g(x):
        return jnp.log(x)                                     # -inf at 0, NaN below
    x = np.array([-1.0, 0.0, 1.0], np.float32)
    assert_matches_cpu(g, x, got=np.array([np.nan, -np.inf, 0.0], np.float32))
    with pytest.raises(AssertionError, match=r"index \(1,\)"):
        assert_matches_cpu(g, x, got=np.array([np.nan, np.inf, 0.0], np.float32))


def test_exact_by_value_and_by_bits():
    def neg(x):
        return -x
    x = np.array([0.0, 1.0], np.float32)
    same_value = np.array([0.0, -1.0], np.float32)         # +0.0 where XLA:CPU gives -0.0
    assert_matches_cpu(neg, x, got=same_value, exact=True)
    with pytest.raises(AssertionError, match="bit for bit"):
        assert_matches_cpu(neg, x, got=same_value, exact="bits")
    with pytest.raises(AssertionError, match="are not equal to"):
        assert_matches_cpu(neg, x, got=np.nextafter(same_value, 1, dtype=np.float32), exact=True)


def test_default_and_per_dtype_tolerances():
    def double(x):
        return x * 2
    x = np.full(4, 1000.0, np.float16)
    rtol = TOLERANCE[np.dtype(np.float16)][0]
    off = np.full(4, 2000.0 * (1 + 3 * rtol), np.float16)   # beyond float16's default
    with pytest.raises(AssertionError, match=r"float16\[4\].*rtol=0.002"):
        assert_matches_cpu(double, x, got=off)
    assert_matches_cpu(double, x, got=off, rtol={np.float16: 1e-2})
    with pytest.raises(AssertionError):                      # a float32 entry leaves float16's default
        assert_matches_cpu(double, x, got=off, rtol={np.float32: 1e-2})


def test_scaled_atol_follows_the_result_scale():
    def scale(x):
        return x * np.float32(1e4)
    x = np.array([1.0, 1e-4], np.float32)
    got = np.array([1e4, 1.5], np.float32)                  # 0.5 off next to a 1e4
    with pytest.raises(AssertionError):
        assert_matches_cpu(scale, x, got=got, rtol=0, atol=1e-4)
    assert_matches_cpu(scale, x, got=got, rtol=0, atol=1e-4, scaled=True)


def test_shapes_dtypes_and_counts_must_agree():
    def h(x):
        return x + 1
    x = np.zeros(3, np.float32)
    with pytest.raises(AssertionError, match=r"the IPU gives int32\[3\], XLA:CPU float32\[3\]"):
        assert_matches_cpu(h, x, got=np.ones(3, np.int32))
    with pytest.raises(AssertionError, match="the IPU gives 2 results, XLA:CPU 1"):
        assert_matches_cpu(h, x, got=[np.ones(3, np.float32)] * 2)
