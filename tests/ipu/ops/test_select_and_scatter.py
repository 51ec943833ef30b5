"""stablehlo.select_and_scatter on the ipu device against JAX's CPU
backend, bit for bit: the gradients of max and min pooling (ties, NaN,
-inf, windows over the edge, float32 and float16, NHWC and NCHW), and
select_and_scatter with other select and scatter bodies, padding and init
values. XLA scans each window in order (the first element selected, each
later one taking its place unless select(selected, element) holds) and
scatters in row-major window order in the operand's type: so does the IPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.lax.windowed_reductions import _select_and_scatter, _select_and_scatter_add

from helpers import assert_matches_cpu


def awkward(shape, dtype, seed=0) -> np.ndarray:
    """Few distinct values (ties in most windows), some NaN and -inf."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 3, shape).astype(dtype)
    x[rng.random(shape) < 0.08] = np.nan
    x[rng.random(shape) < 0.15] = -np.inf
    return x


POOLS = {"2x2-s2-valid": ((2, 2), (2, 2), "VALID"),
         "3x3-s2-same": ((3, 3), (2, 2), "SAME"),
         "3x3-s2-valid": ((3, 3), (2, 2), "VALID"),
         "3x3-s1-same": ((3, 3), (1, 1), "SAME"),
         "2x3-s1-same": ((2, 3), (1, 1), "SAME")}


def pool_dims(layout, window, strides):
    if layout == "NHWC":
        return (1, *window, 1), (1, *strides, 1)
    return (1, 1, *window), (1, 1, *strides)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("pool", list(POOLS), ids=lambda p: f"stablehlo.select_and_scatter-max-{p}")
def test_max_pool_gradient_is_bit_exact(pool, dtype, layout):
    window, strides, padding = POOLS[pool]
    dims, steps = pool_dims(layout, window, strides)
    shape = (2, 9, 8, 3) if layout == "NHWC" else (2, 3, 9, 8)
    x = awkward(shape, dtype)

    def pool(a):
        return lax.reduce_window(a, -jnp.inf, lax.max, dims, steps, padding)
    cotangent = np.random.default_rng(1).standard_normal(jax.eval_shape(pool, x).shape).astype(dtype)
    assert_matches_cpu(lambda a, t: jax.vjp(pool, a)[1](t)[0], x, cotangent, exact="bits")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_min_pool_gradient_is_bit_exact(dtype):
    x = -awkward((2, 9, 9, 2), dtype, seed=1)
    assert_matches_cpu(jax.grad(lambda a: (lax.reduce_window(a, jnp.inf, lax.min, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
                                           * jnp.arange(50, dtype=dtype).reshape(1, 5, 5, 2)).sum()), x, exact="bits")


def test_windows_of_negative_infinity_over_the_edge():
    """A window of -inf over the edge picks the padding, as on XLA:CPU (JAX
    pads with -inf there): the gradient of those elements is zero."""
    x = np.full((1, 4, 4, 1), -np.inf, np.float32)
    x[0, 3, 3, 0] = np.nan
    assert_matches_cpu(jax.grad(lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1),
                                                            "SAME").sum()), x, exact="bits")


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint16], ids=lambda d: np.dtype(d).name)
def test_select_and_scatter_add_of_integers(dtype):
    x = np.random.default_rng(2).integers(0, 3, (2, 6, 6, 2)).astype(dtype)
    assert_matches_cpu(lambda s, a: _select_and_scatter_add(s, a, lax.ge_p, (1, 3, 3, 1), (1, 2, 2, 1),
                                                            ((0, 0), (1, 1), (1, 1), (0, 0))),
                       np.arange(2 * 3 * 3 * 2).reshape(2, 3, 3, 2).astype(dtype), x, exact="bits")


def by_magnitude(a, b):
    return jnp.abs(a) >= jnp.abs(b)


SCANS = {  # select, scatter, init, padding
    "lt-add": (lambda a, b: a < b, lax.add, 0.0, ((0, 0), (0, 0))),
    "magnitude-max-init": (by_magnitude, lax.max, -2.0, ((0, 0), (0, 0))),
    "ge-mul-init": (lambda a, b: a >= b, lax.mul, 1.5, ((0, 0), (0, 0))),
    "ge-add-padding": (lambda a, b: a >= b, lax.add, 0.0, ((1, 2), (2, 1))),
    "ge-add-init-padding": (lambda a, b: a >= b, lax.add, 0.25, ((1, 1), (0, 2))),
}


@pytest.mark.parametrize("case", list(SCANS), ids=lambda c: f"stablehlo.select_and_scatter-{c}")
def test_select_and_scatter_with_other_bodies(case):
    """With padding of its own (JAX's TPU rule; the ipu and CPU rules pad
    the operand instead), XLA:CPU scans windows in another order (column
    by column), where the IPU keeps the row-major scan of its unpadded
    windows: there the values are distinct, so that no order shows."""
    select, scatter, init, padding = SCANS[case]
    if any(lo or hi for lo, hi in padding):
        x = np.random.default_rng(3).permutation(56).reshape(7, 8).astype(np.float32) - 20
    else:
        x = awkward((7, 8), np.float32, seed=3)
        x[np.isinf(x)] = 2.5      # (bodies other than GE need not see -inf)
    window, strides = (3, 2), (2, 1)
    out = [(n + lo + hi - w) // s + 1 for n, (lo, hi), w, s in zip(x.shape, padding, window, strides, strict=True)]
    source = np.random.default_rng(4).standard_normal(out).astype(np.float32)
    assert_matches_cpu(lambda a, s: _select_and_scatter(a, select, window, strides, padding, s, np.float32(init),
                                                        scatter), x, source, exact="bits")


@pytest.mark.parametrize("seed", range(16))
def test_random_windows_strides_and_padding(seed):
    """Windows narrower than, equal to and wider than their strides, with
    uneven edge padding, on two or three axes: the source values each
    element may receive are patterns of the source (repeated over each
    stride, shifted), its position in each window a sum of one constant
    per axis; bit for bit against XLA:CPU."""
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(2, 4))
    window = tuple(int(w) for w in rng.integers(1, 5, rank))
    shape = tuple(max(int(n), w) for n, w in zip(rng.integers(1, 8, rank), window, strict=True))   # a window or more
    strides = tuple(int(s) for s in rng.integers(1, 4, rank))
    pads = tuple((int(rng.integers(0, w)), int(rng.integers(0, w))) for w in window)
    x = awkward(shape, np.float32, seed)
    out = jax.eval_shape(lambda a: lax.reduce_window(a, -jnp.inf, lax.max, window, strides, pads), x).shape
    source = rng.standard_normal(out).astype(np.float32)
    assert_matches_cpu(lambda s, a: _select_and_scatter_add(s, a, lax.ge_p, window, strides, pads),
                       source, x, exact="bits")
