"""Jitted programs on the IPU give the CPU backend's answers: placement
idioms, several outputs, pytrees, scalars and every IPU dtype."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import IPU_DTYPES, assert_matches_cpu, random_array

# float32 within 1e-6 (float16 within 2e-3, the default); integers exact.
TOL = dict(rtol={np.float32: 1e-6}, atol={np.float32: 1e-6})


def test_committed_input_runs_on_its_ipu(ipu):
    x = jax.device_put(np.arange(4, dtype=np.float32), ipu)
    y = jax.jit(lambda x: x * 2 + 1)(x)
    assert y.devices() == {ipu}
    np.testing.assert_array_equal(np.asarray(y), np.arange(4) * 2 + 1)


def test_default_device_context(ipu):
    with jax.default_device(ipu):
        y = jax.jit(lambda x: jnp.sin(x) + 1)(np.linspace(0, 1, 5, dtype=np.float32))
    assert y.devices() == {ipu}
    np.testing.assert_allclose(np.asarray(y), np.sin(np.linspace(0, 1, 5)) + 1, rtol=1e-6)


def test_backend_and_device_arguments(ipus):
    x = np.arange(6, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        y = jax.jit(lambda x: x - 3, backend="ipu")(x)
        z = jax.jit(lambda x: x - 3, device=ipus[1])(x)
    assert y.devices() == {ipus[0]} and z.devices() == {ipus[1]}
    np.testing.assert_array_equal(np.asarray(y), x - 3)
    np.testing.assert_array_equal(np.asarray(z), x - 3)


def test_second_device_keeps_outputs_there(ipus):
    x = jax.device_put(np.ones((3, 3), np.float32), ipus[1])
    y = jax.jit(lambda x: (x @ x, x.sum()))(x)
    assert all(leaf.devices() == {ipus[1]} for leaf in y)
    np.testing.assert_allclose(np.asarray(y[0]), np.full((3, 3), 3.0))


def test_several_outputs_and_pytrees(ipu):
    def f(tree):
        a, (b, c) = tree["a"], tree["bc"]
        return {"sum": a + b, "prod": (a * b, c.astype(jnp.int32)), "scalar": jnp.sum(a)}
    rng = np.random.default_rng(1)
    tree = {"a": rng.standard_normal((4, 5)).astype(np.float32),
            "bc": (rng.standard_normal((4, 5)).astype(np.float32), np.array([True, False]))}
    assert_matches_cpu(f, tree, device=ipu, **TOL)


def test_scalars(ipu):
    f = lambda x, y: (x * y, x > y, jnp.float32(2.5) + x)  # noqa: E731
    args = (np.float32(3.0), np.float32(-1.5))
    got = assert_matches_cpu(f, *args, device=ipu, **TOL)
    assert all(leaf.shape == () for leaf in got)


ELEMENTWISE = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "max": jnp.maximum,
    "min": jnp.minimum,
    "compare": lambda x, y: (x < y, x == y, x >= y),
    "select": lambda x, y: jnp.where(x > y, x, y),
    "neg_abs": lambda x, y: (-x if x.dtype != jnp.bool_ else ~x, jnp.abs(y) if y.dtype != jnp.bool_ else y),
}


# JAX defines no boolean subtraction.
CASES = [(name, dtype) for name in ELEMENTWISE for dtype in IPU_DTYPES
         if not (name == "sub" and dtype == np.bool_)]


@pytest.mark.parametrize("name, dtype", CASES, ids=[f"{n}-{np.dtype(d).name}" for n, d in CASES])
def test_elementwise_every_dtype(ipu, dtype, name):
    f = ELEMENTWISE[name]
    rng = np.random.default_rng(2)
    x, y = random_array(rng, (3, 7), dtype), random_array(rng, (3, 7), dtype)
    assert_matches_cpu(f, x, y, device=ipu, **TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8], ids=lambda d: np.dtype(d).name)
def test_structural_ops(ipu, dtype):
    def f(x):
        y = jnp.transpose(x, (1, 0, 2)).reshape(4, -1)
        z = jnp.concatenate([y[:, ::2], y[:, 1:2]], axis=1)
        b = jnp.broadcast_to(x[0, :1, :], (5, 3))
        i = jnp.arange(5, dtype=x.dtype)
        return z, b, i, x.astype(jnp.float32), jax.lax.bitcast_convert_type(x.astype(jnp.int32), jnp.float32)
    x = random_array(np.random.default_rng(3), (2, 4, 3), dtype)
    assert_matches_cpu(f, x, device=ipu, **TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32], ids=lambda d: np.dtype(d).name)
def test_dot_and_reductions(ipu, dtype):
    def f(a, b, x):
        return (a @ b, jnp.einsum("bij,bjk->bik", x, x.transpose(0, 2, 1)),
                jnp.sum(a, axis=0), jnp.max(a, axis=1), jnp.min(a), jnp.all(a > 0, axis=1),
                jnp.any(b < 0))
    rng = np.random.default_rng(4)
    a, b = random_array(rng, (6, 5), dtype), random_array(rng, (5, 3), dtype)
    x = random_array(rng, (2, 3, 4), dtype)
    assert_matches_cpu(f, a, b, x, device=ipu, rtol={np.float32: 1e-5, np.float16: 2e-3},
                       atol={np.float32: 1e-4, np.float16: 2e-3})


def test_results_feed_further_programs(ipu):
    x = jax.device_put(np.ones(8, np.float32), ipu)
    f = jax.jit(lambda x: x * 1.5)
    for _ in range(5):
        x = f(x)
    np.testing.assert_allclose(np.asarray(x), np.full(8, 1.5 ** 5), rtol=1e-6)


EMPTY_PROGRAMS = {
    "stablehlo.iota-eye0": lambda: jnp.eye(0),
    "stablehlo.iota-eye3x0": lambda: jnp.eye(3, 0),
    "stablehlo.iota-arange0": lambda: jnp.arange(0),
    "stablehlo.while-scan0": lambda: jax.lax.scan(lambda c, x: (c + x, x * 2), 0.0, jnp.zeros(0)),
    "stablehlo.add-empty": lambda: jnp.zeros((0, 3)) + 1,
}


@pytest.mark.parametrize("name", list(EMPTY_PROGRAMS))
def test_programs_of_empty_arrays(ipu, name):
    f = EMPTY_PROGRAMS[name]
    assert_matches_cpu(f, device=ipu, **TOL)


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_constant_scalar_results_keep_shape_and_feed_further_programs(ipu, dtype):
    with jax.default_device(ipu):
        six = jax.jit(lambda: jnp.asarray(6, dtype))()
        assert six.shape == ()
        same = jax.jit(lambda a: a == jnp.asarray(6, dtype))(six)  # the next program checks its input
    assert same.shape == () and bool(same)
