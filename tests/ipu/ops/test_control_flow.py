"""Control flow (stablehlo.while / if / case, func.call inside regions)
through real JAX programs on the IPU Model, against XLA:CPU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu, random_array
from jax_ipu.compiler import compile_module
from jax_ipu.graph.programs import If, Repeat, RepeatWhileTrue, Switch, leaves
from jax_ipu.stablehlo import import_module
from jax_ipu.targets import get_target

# Tolerances by dtype (integers exact).
TOL = {np.float32: 1e-5, np.float16: 2e-3}


def compiled(f, *args):
    return compile_module(import_module(jax.jit(f).lower(*args).as_text()), get_target("ipu2"))


def top_controls(program):
    return [s for s in program.body.steps if isinstance(s, (Repeat, RepeatWhileTrue, If, Switch))]


DTYPES = [np.float32, np.float16, np.int32, np.uint8]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: f"stablehlo.while-fori-{np.dtype(d).name}")
@pytest.mark.parametrize("shape", [(), (5,), (3, 4)], ids=str)
def test_fori_loop(dtype, shape):
    x = random_array(np.random.default_rng(0), shape, dtype)
    assert_matches_cpu(lambda x: lax.fori_loop(0, 4, lambda i, c: c + c // 3 + i.astype(c.dtype)
                                               if np.dtype(dtype).kind != "f" else c * 0.5 + i.astype(c.dtype), x),
                       x, rtol=TOL, atol=TOL)


def test_while_loop_is_repeat_while_true_not_unrolled():
    f = lambda x: lax.while_loop(lambda c: c[1][0] < 1000, lambda c: (c[0] + 1, c[1] * 1.001), (0, x))  # noqa: E731
    program = compiled(f, jnp.ones(8, jnp.float32))
    loops = top_controls(program)
    assert len(loops) == 1 and isinstance(loops[0], RepeatWhileTrue)
    assert loops[0].predicate.shape == () and loops[0].predicate.dtype == np.bool_
    # The iterations are not in the program: only one body's steps.
    assert len(list(leaves(loops[0].body))) < 10


@pytest.mark.parametrize("f", [
    lambda x: lax.while_loop(lambda c: c[0] < 1000, lambda c: (c[0] + 1, c[1] * 1.001), (0, x)),
    lambda x: lax.fori_loop(3, 1003, lambda i, y: y * 1.001, x),
    lambda x: lax.scan(lambda c, _: (c * 1.001, None), x, None, length=1000)[0],
], ids=["while-counter", "fori_loop", "scan"])
def test_counted_loop_is_repeat(f):
    """A counter from a constant, below a constant, by one: Poplar's Repeat."""
    program = compiled(f, jnp.ones(8, jnp.float32))
    (loop,) = top_controls(program)
    assert isinstance(loop, Repeat) and loop.count == 1000
    assert len(list(leaves(loop.body))) < 10
    assert_matches_cpu(f, np.ones(8, np.float32), rtol=TOL, atol=TOL)


def test_a_loop_whose_condition_does_more_stays_repeat_while_true():
    f = lambda x: lax.while_loop(lambda c: (c[0] < 10) & (c[1][0] < 5), lambda c: (c[0] + 1, c[1] + 1), (0, x))  # noqa: E731
    (loop,) = top_controls(compiled(f, jnp.ones(8, jnp.float32)))
    assert isinstance(loop, RepeatWhileTrue)


@pytest.mark.parametrize("n", [0, 1, 7], ids=lambda n: f"stablehlo.while-trips{n}")
def test_while_data_dependent_trip_count(n):
    def f(x, n):
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0 - 1.0), (0, x))
    assert_matches_cpu(f, np.arange(4, dtype=np.float32), np.int32(n), rtol=TOL, atol=TOL)


def test_while_carried_values_of_different_dtypes_and_swap():
    def f(a, b, c):   # body swaps a and b: the copies back must not clobber each other
        return lax.while_loop(lambda s: s[0] < 5, lambda s: (s[0] + 1, s[2], s[1], s[3] ^ (s[1][0] > s[2][0])),
                              (0, a, b, c))
    assert_matches_cpu(f, np.arange(3, dtype=np.float16), -np.arange(3, dtype=np.float16), np.array([True, False]),
                       rtol=TOL, atol=TOL)


def test_nested_loops():
    def f(x):
        def outer(i, c):
            return lax.fori_loop(0, i + 1, lambda j, d: d * 1.5 + j, c) - i
        return lax.fori_loop(0, 3, outer, x)
    assert_matches_cpu(f, np.linspace(-1, 1, 6, dtype=np.float32), rtol=TOL, atol=TOL)


def test_loop_with_matmul_and_reduction():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 16)).astype(np.float32) / 4

    def f(x, w):
        def body(i, c):
            h = jnp.tanh(c @ w)
            return h / (jnp.sum(h * h, axis=1, keepdims=True) + 1.0)
        return lax.fori_loop(0, 5, body, x)
    assert_matches_cpu(f, rng.standard_normal((4, 16)).astype(np.float32), w, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=lambda d: f"stablehlo.while-scan-{np.dtype(d).name}")
def test_scan_with_stacked_outputs(dtype):
    def f(xs):
        def body(c, x):
            c = c + x
            return c, (c * 2, (c > 0).astype(jnp.int32))
        return lax.scan(body, jnp.zeros(xs.shape[1:], xs.dtype), xs)
    assert_matches_cpu(f, random_array(np.random.default_rng(2), (6, 3), dtype), rtol=TOL, atol=TOL)


def test_scan_reverse_and_map():
    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert_matches_cpu(lambda xs: lax.scan(lambda c, x: (c * 0.5 + x, c), jnp.zeros(3), xs, reverse=True), xs,
                       rtol=TOL, atol=TOL)
    assert_matches_cpu(lambda xs: lax.map(lambda r: jnp.sum(r * r) + r[0], xs), xs, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("pred", [True, False], ids=lambda p: f"stablehlo.case-cond-{p}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_cond(pred, dtype):
    x = random_array(np.random.default_rng(3), (5,), dtype)
    assert_matches_cpu(lambda p, x: lax.cond(p, lambda x: (x + x, x[0]), lambda x: (x, x[1]), x), np.bool_(pred), x,
                       rtol=TOL, atol=TOL)


@pytest.mark.parametrize("index", [-3, 0, 1, 2, 9], ids=lambda i: f"stablehlo.case-switch-{i}")
def test_switch_clamps_index(index):
    branches = [lambda x: x + 1, lambda x: x * 3, lambda x: -x]
    assert_matches_cpu(lambda i, x: lax.switch(i, branches, x), np.int32(index), np.arange(4, dtype=np.float32),
                       rtol=TOL, atol=TOL)


def test_case_is_a_switch_with_last_branch_default():
    program = compiled(lambda i, x: lax.switch(i, [lambda x: x + 1, lambda x: x * 3, lambda x: -x], x),
                       jnp.int32(0), jnp.ones(4))
    (switch,) = top_controls(program)
    assert isinstance(switch, Switch) and sorted(switch.cases) == [0, 1]


def test_cond_inside_loop_and_loop_inside_cond():
    def f(x):
        body = lambda i, c: lax.cond(i % 2 == 0, lambda c: c + i, lambda c: c * 2.0, c)  # noqa: E731
        y = lax.fori_loop(0, 5, body, x)
        return lax.cond(y[0] > 0, lambda: lax.fori_loop(0, 3, lambda i, c: c - 1.0, y), lambda: y)
    assert_matches_cpu(f, np.arange(3, dtype=np.float32), rtol=TOL, atol=TOL)


def test_function_called_in_loop_and_twice():
    @jax.jit
    def g(v):
        return jnp.sin(v) + 1.0

    def f(x):
        return lax.fori_loop(0, 3, lambda i, c: g(c) * g(c + 1.0), x)
    assert_matches_cpu(f, np.linspace(0, 1, 5, dtype=np.float32), rtol=TOL, atol=TOL)


def test_fori_loop_with_traced_trip_count(ipu):
    f = jax.jit(lambda x, n: lax.fori_loop(0, n, lambda i, c: c * 2.0, x))
    x = jax.device_put(np.ones(4, np.float32), ipu)
    np.testing.assert_array_equal(np.asarray(f(x, 5)), np.full(4, 32.0, np.float32))


def test_checkify_and_dce_sink():
    """checkify keeps its error flags alive with lax.dce_sink (a custom_call
    without results, which the IPU program simply drops)."""
    from jax.experimental import checkify

    def f(x):
        checkify.check(x > 0, "x must be positive")
        jax.lax.dce_sink(x + 1, prevent_mlir_dce=True)
        return jnp.log(x)
    ipu = jax.devices("ipu")[0]
    checked = jax.jit(checkify.checkify(f))
    err, y = checked(jax.device_put(np.float32(2.0), ipu))
    assert err.get() is None and np.isclose(float(y), np.log(2.0))
    err, _ = checked(jax.device_put(np.float32(-1.0), ipu))
    assert "x must be positive" in err.get()
