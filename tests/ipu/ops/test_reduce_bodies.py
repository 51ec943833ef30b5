"""stablehlo.reduce with general bodies on the ipu device against JAX's
CPU backend: argmax/argmin (two operands, comparator body), variadic
reductions via lax.reduce, bodies of several ops. Exact for integers and
selections; f32 sums within 1e-5."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu


def values(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(-30, 30, shape).astype(dtype)   # many ties


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(50,), (7, 300), (3, 4, 5)], ids=lambda s: "stablehlo.reduce-argmax-" +
                         "x".join(map(str, s)))
def test_argmax_argmin(shape, dtype):
    x = values(shape, dtype)
    assert_matches_cpu(lambda a: (jnp.argmax(a), jnp.argmin(a, axis=-1), jnp.argmax(a, axis=0), jnp.nanargmax(a)
                                  if a.dtype.kind == "f" else jnp.argmax(a)), x, rtol=1e-5, atol=1e-5)


def test_argmax_with_nan():
    x = values((6, 40), np.float32)
    x[2, 5] = x[4, 0] = np.nan
    assert_matches_cpu(lambda a: (jnp.argmax(a, axis=1), jnp.argmin(a, axis=1)), x, rtol=1e-5, atol=1e-5)


def test_variadic_reduce_min_with_payload():
    """lax.reduce over (values, payload): the pair with the smallest value."""
    rng = np.random.default_rng(0)    # distinct values: ties make the reduction order visible
    x = np.stack([rng.permutation(60) for _ in range(5)]).astype(np.float32)
    p = values((5, 60), np.int32, 1)

    def body(a, b):
        take_a = a[0] <= b[0]
        return (jnp.where(take_a, a[0], b[0]), jnp.where(take_a, a[1], b[1]))
    assert_matches_cpu(lambda x, p: lax.reduce((x, p), (np.float32(np.inf), np.int32(-1)), body, (1,)), x, p,
                       rtol=1e-5, atol=1e-5)


def test_body_of_several_ops():
    """Bodies that are not one op (associative, as XLA requires): max of
    |x|, and max + min (a sum)."""
    x = values((4, 33), np.float32) / 7
    assert_matches_cpu(lambda a: lax.reduce(a, np.float32(0), lambda u, v: jnp.maximum(jnp.abs(u), jnp.abs(v)),
                                            (1,)), x, rtol=1e-5, atol=1e-5)
    y = values((9, 20), np.int32)
    assert_matches_cpu(lambda a: lax.reduce(a, np.int32(0), lambda u, v: jnp.maximum(u, v) + jnp.minimum(u, v),
                                            (0,)), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [4, 5, 33, 1000, 100_003])
def test_argmax_with_several_nans_takes_the_first(n):
    """JAX's argmax body keeps its first operand when both are NaN: the
    reduction must pair elements in index order (numpy and XLA:CPU give
    the first NaN's index)."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((6, n)).astype(np.float32)
    for row in x[1:]:
        row[rng.choice(n, min(n - 1, 3 + n // 1000), replace=False)] = np.nan
    x[0, [1, 2]] = np.nan
    f = lambda a: (jnp.argmax(a, axis=1), jnp.argmin(a, axis=1), jnp.argmax(a.T, axis=0))
    assert_matches_cpu(f, x, rtol=1e-5, atol=1e-5)
    got = jax.jit(f)(jax.device_put(x, jax.devices("ipu")[0]))
    np.testing.assert_array_equal(np.asarray(got[0]), np.argmax(x, axis=1))
    np.testing.assert_array_equal(np.asarray(got[1]), np.argmin(x, axis=1))


def test_bodies_that_are_not_commutative_see_operands_in_order():
    """'First non-zero' and 'last non-zero' reducers (associative, not
    commutative) as XLA:CPU's sequential reduction gives them."""
    x = np.array([[0, 0, 3, 0, 5, 7, 0, 2], [0, 4, 0, 0, 0, 0, 9, 0]] * 20, np.float32)
    x[5:, 3] = np.arange(35)
    assert_matches_cpu(lambda a: (lax.reduce(a, np.float32(0), lambda p, q: jnp.where(p != 0, p, q), (1,)),
                                  lax.reduce(a, np.float32(0), lambda p, q: jnp.where(q != 0, q, p), (1,)),
                                  lax.reduce(a, np.float32(0), lambda p, q: jnp.where(p != 0, p, q), (0,))), x,
                       rtol=1e-5, atol=1e-5)


def test_bodies_written_with_jnp_operators():
    """jnp's operators put scalar broadcast_in_dim ops (no-ops) in the body:
    a NaN-propagating max, in reduce and reduce_window."""
    def nanmax(p, q):
        return jnp.where((p > q) | (p != p), p, q)
    x = np.array([[1, np.nan, 3, 0, 2], [4, 1, 0, -2, 5]], np.float32)
    # (with a weakly typed init, as users write it; np.float32 inits give no broadcasts)
    assert_matches_cpu(lambda a: (lax.reduce(a, -jnp.inf, nanmax, (1,)),
                                  lax.reduce_window(a, -jnp.inf, nanmax, (1, 2), (1, 1), "VALID")), x,
                       rtol=1e-5, atol=1e-5)
    assert "broadcast_in_dim" in jax.jit(lambda a: lax.reduce(a, -jnp.inf, nanmax, (1,))).lower(x).as_text()
