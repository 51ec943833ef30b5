"""A product over one term (K = 1) keeps the sign of its zero, as XLA:CPU's
does, whatever its type or batch; a sum of negative zero products is
positive zero on both backends. (Found by differential fuzzing.)"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import on_cpu, run_on


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_product_over_one_term_keeps_the_sign_of_zero(ipu, dtype):
    a, b = np.array([[-0.0], [0.0], [-2.0]], dtype), np.array([[1.0, -0.0, 3.0]], dtype)
    got, want = run_on(ipu, jnp.matmul, a, b), a * b        # over K = 1, each element is one product
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


def test_a_sum_of_negative_zero_products_is_positive_zero_on_the_ipu(ipu):
    """Accepted (docs/fuzzing.md): over K > 1 the IPU starts the sum from
    +0.0, so products that are all -0.0 sum to +0.0 (IEEE, summing the
    products alone: -0.0). XLA:CPU gives one of the two."""
    a, b = -np.zeros((2, 3), np.float32), np.ones((3, 2), np.float32)
    got = run_on(ipu, jnp.matmul, a, b)
    assert not np.signbit(got).any()
    assert (on_cpu(jnp.matmul, a, b) == 0).all()      # a zero of either sign
