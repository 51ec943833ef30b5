"""Every kernel's fast executor (model/fast/, registered in model/registry.py)
gives its reference executor's values (model/executors/), over random
programs: each program runs on an Engine with the fast machinery (fast
executors, fusions, lanes, lazy Copies, the helper thread, straight-line
programs) and on one with the reference executors alone.

The sizes from which a fast path is taken are lowered here, so that small
programs take every one of them: cache-sized chunks, the helper thread's
halves, lanes, XLA:CPU chains, BLAS row blocks, short-axis reductions.

The values must be the same bits, with one reason documented for where
they may not: the rounding inside one vertex's float arithmetic belongs to
the host library that does it fast. A K-chunk's dot product is BLAS's
(whose order of additions depends on the call's shape), a float sum over a
chunk is numpy's (pairwise) in the reference and in order over short axes,
and a float32 chain handed to XLA:CPU rounds as XLA:CPU does (its
transcendental functions, a multiply contracted into an add, as in the
BLAS axpy of an SGD update). Programs of such arithmetic are compared
within float tolerance; everything else (data movement, integers,
comparisons, float16 chains, whose every op is rounded as numpy rounds
it, the plan's partitioning and its fixed-order combine) bit for bit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

from helpers import SMALL, compile_fn
from jax_ipu.graph import codelets
from jax_ipu.graph.codelets_conv import ConvPartials
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.model import registry
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import blas, chains, helper, lanes, xla_chains
from jax_ipu.model.fast import reduce as fast_reduce

# The kernels whose fast executors (and fusions) the families of programs
# below reach, and which tests reach them.
COVERED = {codelets.ElementwiseChain: "elementwise chains, updates", codelets.MatMulPartials: "products",
           codelets.ReducePartials: "reductions", codelets.ReduceCombine: "reductions, products",
           ConvPartials: "convolutions"}
EXAMPLES = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture
def fast_everywhere(monkeypatch):
    """Every fast path from small sizes on, the helper thread whatever the load."""
    monkeypatch.setattr(chains, "CHAIN_CHUNK", 64)
    monkeypatch.setattr(chains, "FAST_CHAIN_CHUNK", 128)
    monkeypatch.setattr(chains, "SHARED_CHAIN", 256)
    monkeypatch.setattr(chains, "FAST_SHARED_CHAIN", 256)
    monkeypatch.setattr(xla_chains, "MIN_ELEMENTS", 256)
    monkeypatch.setattr(blas, "SHARED_MACS", 1 << 10)
    monkeypatch.setattr(blas, "SGEMM_MACS", 1 << 8)
    monkeypatch.setattr(fast_reduce, "SHORT_AXIS_ROWS", 8)
    monkeypatch.setattr(lanes, "MIN_GROUP_WORK", 1 << 8)
    monkeypatch.setattr(helper, "spare_core", lambda *a: True)
    yield
    helper.end_session()


def kinds(program) -> set:
    return {type(s.compute_set.kernel) for s in leaves(program.body) if isinstance(s, Execute)}


def run_both(f, *args, exact: bool):
    """Runs f's program on both Engines and compares; returns its kernel classes."""
    program = compile_fn(f, *args)
    inputs = [np.asarray(a) for a in args]
    fast = Engine(SMALL).run(program, [a.copy() for a in inputs], checked=False)
    fast_again = Engine(SMALL).run(program, [a.copy() for a in inputs])
    reference = Engine(SMALL, fast=False).run(program, [a.copy() for a in inputs])
    for got, again, want in zip(fast, fast_again, reference, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, again)          # the fast paths never depend on the load
        if exact or want.dtype.kind != "f":
            assert np.array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}")), \
                f"not the reference's bits: {np.count_nonzero(got != want)} of {got.size} differ"
        else:
            scale = max(1.0, float(np.abs(want[np.isfinite(want)]).max(initial=0)))
            tol = 1e-5 if want.dtype == np.float32 else 4e-3
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)
    return kinds(program)


def floats(draw, shape, dtype, scale=1.0):
    seed = draw(st.integers(0, 2 ** 16))
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


# Element-wise ops whose float results are exact in numpy and XLA alike
# (correctly rounded or exact), and ops the host library rounds its way.
EXACT_UNARY = {"neg": jnp.negative, "abs": jnp.abs, "floor": jnp.floor, "sqrt": lambda x: jnp.sqrt(jnp.abs(x))}
EXACT_BINARY = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
                "div": lambda a, b: a / (jnp.abs(b) + 1), "select": lambda a, b: jnp.where(a > b, a, b)}
LIBRARY_UNARY = {"tanh": jnp.tanh, "exp": lambda x: jnp.exp(-jnp.abs(x)), "log": lambda x: jnp.log1p(jnp.abs(x))}


@st.composite
def elementwise_programs(draw, library: bool):
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    shape = draw(st.sampled_from([(300,), (24, 40), (5, 7, 33), (1030,)]))
    unary = {**EXACT_UNARY, **(LIBRARY_UNARY if library else {})}
    steps = draw(st.lists(st.one_of(st.sampled_from(sorted(unary)).map(lambda n: (1, n)),
                                    st.sampled_from(sorted(EXACT_BINARY)).map(lambda n: (2, n))),
                          min_size=1, max_size=6))
    scalar = draw(st.floats(-3, 3, width=16))
    ints = draw(st.booleans())

    def f(x, y):
        v = x
        for arity, name in steps:
            v = unary[name](v) if arity == 1 else EXACT_BINARY[name](v, y)
        out = [v * dtype(scalar), jnp.maximum(v, dtype(scalar)), y - v]
        if ints:
            out.append((v > y).astype(jnp.int32) + jnp.floor(v).astype(jnp.int32))
        return out
    return f, (floats(draw, shape, dtype), floats(draw, shape, dtype))


@st.composite
def update_programs(draw):
    """SGD-shaped updates y - c * x (BLAS axpy)."""
    shape = draw(st.sampled_from([(257,), (64, 33), (1000,)]))
    lr = draw(st.floats(2 ** -10, 1.0, width=32))

    def f(w, g, c):
        return w - lr * g, w + c * g
    return f, (floats(draw, shape, np.float32), floats(draw, shape, np.float32), np.float32(lr))


@st.composite
def product_programs(draw):
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    batch = draw(st.sampled_from([(), (3,)]))
    m, k, n = draw(st.integers(1, 70)), draw(st.sampled_from([7, 64, 300, 700])), draw(st.integers(1, 40))
    chained = draw(st.booleans())

    def f(a, b):
        out = jnp.matmul(a, b, preferred_element_type=jnp.float32)
        return jnp.tanh(out) @ jnp.swapaxes(b, -1, -2).astype(jnp.float32) if chained else out
    return f, (floats(draw, (*batch, m, k), dtype), floats(draw, (*batch, k, n), dtype, 0.1))


@st.composite
def convolution_programs(draw):
    """Planned convolutions (strided, dilated, grouped, in several
    layouts) and their gradients: several chunks of partials, summed."""
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    groups = draw(st.sampled_from([1, 2]))
    cin, cout = groups * draw(st.integers(1, 20)), groups * draw(st.integers(1, 6))
    k, stride, dil = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    specs = draw(st.sampled_from([("NHWC", "HWIO", "NHWC"), ("NCHW", "OIHW", "NCHW")]))
    grads = draw(st.booleans())
    x = floats(draw, (2, 9, 8, cin) if specs[0] == "NHWC" else (2, cin, 9, 8), dtype)
    w = floats(draw, (k, k, cin // groups, cout) if specs[1] == "HWIO" else (cout, cin // groups, k, k), dtype, 0.3)

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (stride, stride), "SAME", rhs_dilation=(dil, dil),
                                        dimension_numbers=specs, feature_group_count=groups,
                                        preferred_element_type=jnp.float32)

    def f(x, w):
        if grads:
            return jax.grad(lambda x, w: (conv(x, w) ** 2).sum(), argnums=(0, 1))(x, w)
        return conv(x, w)
    return f, (x, w)


@st.composite
def reduction_programs(draw):
    dtype = draw(st.sampled_from([np.float32, np.float16, np.int32]))
    shape = draw(st.sampled_from([(64, 5), (40, 12), (600, 3), (9, 130), (3, 40, 9)]))
    axis = draw(st.integers(0, len(shape) - 1))
    op = draw(st.sampled_from(["sum", "max", "min"]))
    x = floats(draw, shape, np.float32, 4.0)
    x = x.astype(dtype) if dtype != np.int32 else np.round(x).astype(dtype)

    def f(x):
        return getattr(jnp, op)(x, axis=axis), getattr(jnp, op)(x, axis=-1, keepdims=True) * 2
    return f, (x,), op != "sum" or dtype == np.int32


def test_every_fast_executor_has_programs_here():
    assert set(registry.FAST) <= set(COVERED), f"no random programs for {set(registry.FAST) - set(COVERED)}"
    assert set(registry.FUSIONS) <= set(COVERED)


@pytest.mark.usefixtures("fast_everywhere")
@given(elementwise_programs(library=False))
@EXAMPLES
def test_elementwise_chains_give_the_reference_bits(case):
    f, args = case
    assert codelets.ElementwiseChain in run_both(f, *args, exact=True)


@pytest.mark.usefixtures("fast_everywhere")
@given(elementwise_programs(library=True))
@EXAMPLES
def test_chains_with_library_functions_are_within_float_tolerance(case):
    f, args = case
    run_both(f, *args, exact=False)


@pytest.mark.usefixtures("fast_everywhere")
@given(update_programs())
@EXAMPLES
def test_sgd_updates_are_within_one_rounding(case):
    f, args = case
    run_both(f, *args, exact=False)


@pytest.mark.usefixtures("fast_everywhere")
@given(product_programs())
@EXAMPLES
def test_products_and_their_sums_are_within_float_tolerance(case):
    f, args = case
    found = run_both(f, *args, exact=False)
    assert codelets.MatMulPartials in found


@pytest.mark.usefixtures("fast_everywhere")
@given(convolution_programs())
@EXAMPLES
def test_convolutions_and_their_sums_are_within_float_tolerance(case):
    f, args = case
    assert ConvPartials in run_both(f, *args, exact=False)


@pytest.mark.usefixtures("fast_everywhere")
@given(reduction_programs())
@EXAMPLES
def test_reductions_give_the_reference_bits_but_for_float_sums(case):
    f, args, exact = case
    run_both(f, *args, exact=exact)


@st.composite
def data_movement_programs(draw):
    """Programs of every other kind of kernel (gathers, scatters, slices,
    sorts, windows, convolutions): the engine's machinery around them
    (lazy Copies, lanes, straight-line runs) changes no value."""
    which = draw(st.sampled_from(["gather", "scatter", "dynamic", "sort", "pool", "conv", "top_k"]))
    x = floats(draw, (6, 10, 10, 4), np.float32)
    rows = np.asarray(draw(st.lists(st.integers(-2, 8), min_size=1, max_size=12)), np.int32)

    def f(x):
        if which == "gather":
            return x[:, rows % 10], jnp.take(x.reshape(-1), rows * 7, mode="clip")
        if which == "scatter":
            return x.at[:, rows % 10].add(1.0), x.at[rows % 6].max(x[0] * 2)
        if which == "dynamic":
            return lax.dynamic_slice(x, (rows[0], 2, 1, 0), (3, 4, 5, 2)), \
                lax.dynamic_update_slice(x, x[:2, :3] * 2, (rows[-1], 1, 7, 0))
        if which == "sort":
            return jnp.sort(x, axis=2), jnp.argsort(x.reshape(60, 40), axis=0)
        if which == "pool":
            def pool(x):
                return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "SAME").sum()
            return jax.grad(pool)(x), lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "VALID")
        if which == "conv":
            w = jnp.ones((3, 3, 4, 5), x.dtype) * 0.1
            return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return lax.top_k(x.reshape(60, 40), 5)
    return f, (x,), which not in ("conv", "pool")


@pytest.mark.usefixtures("fast_everywhere")
@given(data_movement_programs())
@EXAMPLES
def test_other_kernels_run_the_same_among_fast_ones(case):
    f, args, exact = case
    run_both(f, *args, exact=exact)


def test_the_reference_engine_runs_no_fast_executor(monkeypatch):
    """Engine(fast=False) builds every kernel with its reference executor."""
    called = []
    for kind, build in registry.FAST.items():
        monkeypatch.setitem(registry.FAST, kind, lambda *a, build=build: called.append(a) or build(*a))
    x = np.ones((64, 64), np.float32)
    program = compile_fn(lambda x: jnp.tanh(x @ x).sum(0), x)
    Engine(SMALL, fast=False).run(program, [x])
    assert not called
    Engine(SMALL).run(program, [x])
    assert called
