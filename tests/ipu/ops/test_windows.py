"""stablehlo.reduce_window, select_and_scatter, pad and reverse on the ipu
device against JAX's CPU backend: pooling (avg/max/min, padding, strides,
base and window dilation), cumulative ops, and the gradients of pooling.
Tolerances: f32 1e-5 (sums over windows in tree order), f16 2e-3,
integers and max/min exact."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu


def rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-20, 20, shape).astype(dtype)


# Tolerances by dtype (integers exact), as the docstring states.
TOL = {np.float32: 1e-5, np.float16: 2e-3}


NHWC_2x2 = ((1, 2, 2, 1), (1, 2, 2, 1))
POOLS = {
    "max-valid": (-np.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID", {}),
    "max-same-overlap": (-np.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME", {}),
    "min-pad": (np.inf, lax.min, (1, 2, 3, 1), (1, 1, 2, 1), ((0, 0), (1, 1), (2, 0), (0, 0)), {}),
    "sum-same": (0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME", {}),
    "sum-dilated": (0, lax.add, (1, 2, 2, 1), (1, 2, 1, 1), ((0, 0), (1, 2), (0, 1), (0, 0)),
                    dict(base_dilation=(1, 2, 1, 1), window_dilation=(1, 1, 2, 1))),
    "mul": (1, lax.mul, (1, 2, 1, 2), (1, 1, 1, 1), "VALID", {}),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", list(POOLS), ids=lambda c: f"stablehlo.reduce_window-{c}")
def test_reduce_window(case, dtype):
    init, fn, window, strides, padding, kwargs = POOLS[case]
    if np.dtype(dtype).kind != "f" and np.isinf(init):
        init = np.iinfo(dtype).min if init < 0 else np.iinfo(dtype).max
    x = rand((2, 7, 6, 3), dtype) * (np.asarray(0.5, dtype) if fn is lax.mul else np.asarray(1, dtype))
    assert_matches_cpu(lambda a: lax.reduce_window(a, np.asarray(init, dtype), fn, window, strides, padding,
                                                   **kwargs), x, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("fn", [jnp.cumsum, jnp.cumprod, lax.cummax, lax.cummin],
                         ids=lambda f: f"stablehlo.reduce_window-{f.__name__}")
def test_cumulative(fn):
    x = rand((5, 9), np.float32) * 0.7
    assert_matches_cpu(lambda a: (fn(a, axis=1), fn(a, axis=0)), x, rtol=TOL, atol=TOL)


def test_avg_pool_and_its_gradient():
    x = rand((2, 8, 8, 3), np.float32)

    def avg_pool(a):
        return lax.reduce_window(a, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "SAME") / 4
    assert_matches_cpu(lambda a: (avg_pool(a), jax.grad(lambda b: (avg_pool(b) ** 2).sum())(a)), x, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("window,strides,padding", [((1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
                                                    ((1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
                                                    ((1, 3, 2, 1), (1, 1, 1, 1), "SAME")],
                         ids=["stablehlo.select_and_scatter-2x2", "stablehlo.select_and_scatter-3x3-overlap",
                              "stablehlo.select_and_scatter-stride1"])
def test_max_pool_gradient(window, strides, padding):
    x = rand((2, 7, 8, 3), np.float32)

    def loss(a):
        return (lax.reduce_window(a, -jnp.inf, lax.max, window, strides, padding) ** 2).sum()
    assert_matches_cpu(jax.grad(loss), x, rtol=TOL, atol=TOL)


def test_max_pool_gradient_ties_go_to_the_first():
    x = np.zeros((1, 4, 4, 1), np.float32)
    x[0, 1, 1, 0] = x[0, 2, 3, 0] = 1.0
    assert_matches_cpu(jax.grad(lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1),
                                                            "SAME").sum()), x, rtol=TOL, atol=TOL)


def test_min_pool_gradient():
    x = rand((1, 6, 6, 2), np.float32)
    assert_matches_cpu(jax.grad(lambda a: lax.reduce_window(a, jnp.inf, lax.min, (1, 2, 2, 1), (1, 2, 2, 1),
                                                            "VALID").sum()), x, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.int8], ids=lambda d: np.dtype(d).name)
def test_pad_and_reverse(dtype):
    x = rand((3, 4, 5), dtype)
    assert_matches_cpu(lambda a: (jnp.pad(a, ((1, 2), (0, 1), (2, 0))),
                                  lax.pad(a, np.asarray(3, dtype), ((1, 2, 1), (-1, 0, 2), (0, -2, 0))),
                                  lax.rev(a, (0, 2))), x, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("config", [((1, 2, 1), (-1, 0, 2), (0, -2, 0)), ((0, 0, 0), (2, 1, 0), (1, 1, 1))],
                         ids=["negative-interior", "edges"])
def test_pad_with_run_time_value(dtype, config):
    """The padding value is an argument (associative_scan pads so)."""
    x = rand((3, 4, 5), dtype) if dtype != np.bool_ else rand((3, 4, 5), np.int32) > 0
    assert_matches_cpu(lambda a, v: lax.pad(a, v, config), x, np.asarray(7 if dtype != np.bool_ else True, dtype),
                       rtol=TOL, atol=TOL)
    assert_matches_cpu(lambda a, v: lax.pad(a, v[1], config), x, np.asarray([3, 4], dtype), rtol=TOL, atol=TOL)


def test_pad_with_run_time_value_of_empty_operand():
    assert_matches_cpu(lambda a, v: lax.pad(a, v, ((1, 2, 0), (0, 1, 0))), np.zeros((0, 3), np.float32),
                       np.asarray(2.5, np.float32), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", ["max-same-overlap", "min-pad", "sum-dilated", "mul"],
                         ids=lambda c: f"stablehlo.reduce_window-{c}")
def test_reduce_window_with_run_time_init(case, dtype):
    """The init value is an argument (lax_test passes it so): padding and
    dilation holes hold it, and the reduction starts from it. (XLA:CPU
    skips holes rather than reading the init value there: the two agree
    when the init value is the body's identity, or there are no holes.)"""
    init, fn, window, strides, padding, kwargs = POOLS[case]
    if np.dtype(dtype).kind != "f" and np.isinf(init):
        init = np.iinfo(dtype).min if init < 0 else np.iinfo(dtype).max
    if case == "mul":
        init = 2     # no padding: any init value
    x = rand((2, 7, 6, 3), dtype) * (np.asarray(0.5, dtype) if fn is lax.mul else np.asarray(1, dtype))
    assert_matches_cpu(lambda a, init: lax.reduce_window(a, init, fn, window, strides, padding, **kwargs),
                       x, np.asarray(init, dtype), rtol=TOL, atol=TOL)


def test_variadic_reduce_window_with_run_time_inits():
    def f(a, b, ia, ib):
        def body(x, y):
            pick = x[0] >= y[0]
            return lax.select(pick, x[0], y[0]), lax.select(pick, x[1], y[1])
        return lax.reduce_window((a, b), (ia, ib), body, (2, 3), (1, 2), ((1, 0), (1, 1)))
    assert_matches_cpu(f, rand((5, 6), np.float32), rand((5, 6), np.int32, 1), np.float32(-1.5), np.int32(-7),
                       rtol=TOL, atol=TOL)


def _custom_max(x, y):
    return lax.select(x >= y, x, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("padding", ["VALID", "SAME"])
def test_jvp_of_reduce_window_with_a_custom_body(dtype, padding):
    """The generic reduce_window JVP's body reads constants defined outside
    it (lax_test's testReduceWindowCustomSameAsMonoid)."""
    x, t = rand((4, 6), dtype), rand((4, 6), dtype, 1)
    f = lambda a: lax.reduce_window(a, np.asarray(-np.inf, dtype), _custom_max, (2, 3), (1, 2), padding)
    assert_matches_cpu(lambda a, b: jax.jvp(f, (a,), (b,)), x, t, rtol=TOL, atol=TOL)


def test_pad_and_reverse_of_a_scalar_stay_scalars():
    """An empty pad (and rev) of a 0-d array gives a 0-d array that the
    next program accepts (the gather index was once made 1-d)."""
    ipu = jax.devices("ipu")[0]
    x = jax.device_put(np.float16(0.5), ipu)
    y = jax.jit(lambda o: lax.pad(o, np.array(0, np.float16), ()))(x)
    z = jax.jit(lambda o: lax.rev(o, ()) * 2)(y)
    assert y.shape == z.shape == ()
    assert float(z) == 1.0
    _, vjp = jax.vjp(lambda o: lax.pad(o, np.array(0, np.float16), ()), x)
    assert float(vjp(jax.device_put(np.float16(3.0), ipu))[0]) == 3.0


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("window", [(2, 2), (3, 3)])
def test_pooling_many_windows_element_by_element(dtype, window):
    """Thousands of small windows: the IPU Model reduces each window's few
    elements one after the other (model/fast/reduce.py SHORT_AXIS), in order as XLA:CPU
    does; max and min exact, sums within the stated tolerance."""
    from jax_ipu.model.fast import reduce as reduce_executor
    assert window[0] * window[1] <= reduce_executor.SHORT_AXIS
    x = rand((8, 28, 28, 16), dtype, seed=5)
    dims, strides = (1, *window, 1), (1, *window, 1)
    init_max = -np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min
    init_min = np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).max
    assert_matches_cpu(lambda x: (lax.reduce_window(x, np.array(init_max, dtype), lax.max, dims, strides, "VALID"),
                                  lax.reduce_window(x, np.array(init_min, dtype), lax.min, dims, strides, "SAME")), x,
                       rtol=TOL, atol=TOL)

    def sums(x):
        return lax.reduce_window(x, np.array(0, dtype), lax.add, dims, (1, 1, 1, 1), "VALID")
    # (float16: every add rounded to float16, in the window's order; XLA:CPU
    # rounds every add too, in its own order: within the f16 tolerance)
    assert_matches_cpu(sums, x, **({} if np.dtype(dtype) == np.float16 else {"rtol": TOL, "atol": TOL}))


@pytest.mark.parametrize("narrow", [False, True])
def test_window_index_combine_matches_per_axis_sums(narrow):
    # Flat indices summed smallest broadcast first, padding (-1 on any
    # axis) kept -1, int32 with `narrow` where they fit.
    from jax_ipu.compiler.planners.windows import combine
    rng = np.random.default_rng(0)
    for _ in range(200):
        full = rng.integers(1, 5, rng.integers(1, 5))
        per_axis = [rng.integers(-1, 6, [n if rng.random() < 0.5 else 1 for n in full])
                    for _ in range(rng.integers(1, 5))]
        strides = list(rng.integers(1, 50, len(per_axis)))
        want = sum(np.maximum(a, 0) * s for a, s in zip(per_axis, strides, strict=True)) + np.zeros(full, np.int64)
        want[np.logical_or.reduce([np.broadcast_to(a < 0, want.shape) for a in per_axis])] = -1
        got = combine(per_axis, strides, narrow)
        assert got.dtype == (np.int32 if narrow else np.int64)
        np.testing.assert_array_equal(np.broadcast_to(got, want.shape), want)
    wide = combine([np.array([-1, 3])[:, None], np.array([0, 1])], [1 << 29, 1 << 30], narrow=True)
    assert wide.dtype == np.int64
    np.testing.assert_array_equal(wide, [[-1, -1], [3 << 29, (3 << 29) + (1 << 30)]])
