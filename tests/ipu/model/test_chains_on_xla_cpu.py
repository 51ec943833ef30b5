"""Large element-wise chains with ops numpy does slowly run as one XLA:CPU
kernel (model/fast/xla_chains.py). Their values are checked against XLA:CPU
running the same jitted function, and against the Model's numpy kernels;
chains XLA must not take stay on numpy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import SMALL, compile_fn, on_cpu
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.model import registry
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import xla_chains
from jax_ipu.model.fast.views import reader

N = xla_chains.MIN_ELEMENTS + 3


def chain_runners(program) -> list[str]:
    return [registry.build(s.compute_set.kernel, reader).__name__ for s in leaves(program.body)
            if isinstance(s, Execute) and isinstance(s.compute_set.kernel, codelets.ElementwiseChain)]


def on_both(monkeypatch, f, *args):
    """(outputs through XLA chains, outputs through numpy chains) of f on the
    Model; asserts that XLA took at least one chain."""
    program = compile_fn(f, *args)
    assert "run_on_xla" in chain_runners(program)
    on_xla = Engine(SMALL).run(program, [np.array(a) for a in args])
    monkeypatch.setattr(xla_chains, "ENABLED", False)
    assert "run_on_xla" not in chain_runners(program)
    on_numpy = Engine(SMALL).run(program, [np.array(a) for a in args])
    monkeypatch.setattr(xla_chains, "ENABLED", True)
    return on_xla, on_numpy


def cpu_leaves(f, *args):
    return jax.tree.leaves(on_cpu(f, *args))


rng = np.random.default_rng(0)
X = rng.standard_normal(N).astype(np.float32) * 3
Y = rng.standard_normal(N).astype(np.float32) * 3

FLOAT_CHAINS = {
    "tanh": lambda x, y: jnp.tanh(x * 1.5 + y),
    "exp_log": lambda x, y: jnp.exp(-x * x) + jnp.log(jnp.abs(y) + 1e-3),
    "log1p_expm1": lambda x, y: jnp.log1p(jnp.abs(x)) - jnp.expm1(y * 0.1),
    "trig": lambda x, y: jnp.sin(x) * jnp.cos(y) + jnp.tan(x * 0.1),
    "atan2_pow": lambda x, y: jnp.arctan2(x, y) + jnp.power(jnp.abs(x) + 0.5, y * 0.3),
    "logistic_rsqrt": lambda x, y: jax.nn.sigmoid(x) * lax.rsqrt(jnp.abs(y) + 1.0),
    "cbrt_sign": lambda x, y: jnp.cbrt(x) * jnp.sign(y),
    "select_compare": lambda x, y: jnp.where(x > y, jnp.exp(x * 0.1), jnp.maximum(y, 0.0)),
    "clamp_round": lambda x, y: jnp.round(jnp.clip(jnp.exp(x * 0.2), 0.5, 2.0) * 7) + jnp.floor(y),
    "divide_remainder": lambda x, y: jnp.exp(x * 0.1) / (y + 0.5) + jnp.fmod(x, y + 7.0),
    "nonfinite": lambda x, y: jnp.isfinite(jnp.exp(x * 40.0)).astype(jnp.float32) + jnp.log(x) * y,
}


@pytest.mark.parametrize("name", sorted(FLOAT_CHAINS))
def test_float_chains_match_xla_cpu(monkeypatch, name):
    f = FLOAT_CHAINS[name]
    on_xla, on_numpy = on_both(monkeypatch, f, X, Y)
    [want] = cpu_leaves(f, X, Y)
    # The same compiler, though not the same fusions (XLA may contract a
    # multiply into the last step of an exp): within 2 ulp, NaN where XLA:CPU
    # has NaN. numpy's libm differs by a few ulp from XLA's approximations.
    np.testing.assert_allclose(on_xla[0], want, rtol=2.5e-7, atol=1e-7, equal_nan=True)
    np.testing.assert_allclose(on_numpy[0], want, rtol=2e-5, atol=2e-6, equal_nan=True)


H = (X * 1.3).astype(np.float16)
G = (Y * 0.7).astype(np.float16)


def _gelu(x, b):
    h = x + b
    return h * (0.5 * (1.0 + jnp.tanh(0.7978846 * (h + 0.044715 * h * h * h)))).astype(h.dtype)


def _layer_norm(x, g):
    """A float16 chain with float32 steps (statistics as Flax computes them)."""
    w = x.astype(jnp.float32)
    centred = w - 0.25
    return (centred / jnp.sqrt(centred * centred + 1e-5) * g.astype(jnp.float32) + 0.5).astype(jnp.float16)


# float16 chains XLA:CPU takes with each op rounded to float16 (xla_chains._rounded).
F16_CHAINS = {
    "gelu_tanh": _gelu,
    "multiply_add": lambda x, y: x * y + x * 0.3 - y,         # XLA would contract these into FMAs
    "divide_by_constants": lambda x, y: x / 3.0 + y / 7.0 - (x - y) / 0.1,
    "relu_select_clamp": lambda x, y: jnp.where(x > y, jnp.maximum(x, 0.0) * y, jnp.clip(y * 1.7, -1.0, 2.0)),
    "layer_norm_mixed": _layer_norm,
    "sqrt_abs_neg": lambda x, y: -jnp.sqrt(jnp.abs(x) * y * y) + jnp.abs(y),
    "overflow_subnormal": lambda x, y: (x * 3e4) * y + (x * 1e-6) * (y * 1e-2),    # inf and subnormal results
}


@pytest.mark.parametrize("name", sorted(F16_CHAINS))
def test_float16_chains_give_the_numpy_kernels_bits(monkeypatch, name):
    """A float16 chain on XLA gives the bits of the Model's numpy kernel
    (every op rounded to float16, no fused multiply-add), and is within
    float16 rounding of XLA:CPU's own (which keeps intermediates in float32)."""
    f = F16_CHAINS[name]
    x = np.concatenate([H, np.array([0, -0.0, np.inf, -np.inf, np.nan, 6e-8, -6e-8, 65504], np.float16)])
    y = np.concatenate([G, np.array([1, 2, 3, -1, 0.5, 1e-4, 7, -65504], np.float16)])
    on_xla, on_numpy = on_both(monkeypatch, f, x, y)
    assert on_xla[0].dtype == np.float16
    same = (on_xla[0].view(np.uint16) == on_numpy[0].view(np.uint16)) | (np.isnan(on_xla[0]) & np.isnan(on_numpy[0]))
    assert same.all(), (x[~same][:5], y[~same][:5], on_xla[0][~same][:5], on_numpy[0][~same][:5])
    [want] = cpu_leaves(f, x, y)
    finite = np.isfinite(want.astype(np.float32))
    # Per-op float16 rounding against XLA's float32 intermediates: a few
    # float16 ulps, more where a difference cancels.
    np.testing.assert_allclose(on_xla[0][finite].astype(np.float32), want[finite].astype(np.float32),
                               rtol=1e-2, atol=2e-2 * float(np.max(np.abs(want[finite]))))
    np.testing.assert_array_equal(np.isnan(on_xla[0]), np.isnan(want.astype(np.float32)))


@pytest.mark.parametrize("op", ["tanh", "exponential", "log", "sqrt", "rsqrt", "logistic", "negate", "abs",
                                "floor", "is_finite", "sign"])
def test_float16_unary_ops_are_checked_on_every_value(op):
    """_f16_op_agrees answers from all 65,536 float16 inputs: when it says
    yes, XLA's kernel gives numpy's bits for each; an op it refuses has
    some value that differs."""
    from jax_ipu import ops
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    ufunc = ops.ufunc_for(op, np.dtype(np.float16))
    with np.errstate(all="ignore"):
        want = np.asarray(ufunc(values) if ufunc is not None
                          else ops.function_for(op)(values, dtype=np.dtype(np.float16), attrs={}))
    got = np.asarray(jax.jit(ops.OPS[op].lax(lax))(jax.device_put(values, jax.devices("cpu")[0])))
    same = (got == want) | (np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))) \
        if want.dtype != np.float16 else \
        (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    assert xla_chains._f16_op_agrees(op) == bool(np.all(same))
    for exact in ("negate", "abs", "floor", "sqrt", "is_finite"):   # correctly rounded everywhere
        if op == exact:
            assert xla_chains._f16_op_agrees(op)


INT_CHAINS = {
    # x / 0 is -1 and x % 0 is x, as XLA defines them.
    "divide_remainder": (lambda a, b: (a // b, lax.rem(a, b)), np.int32),
    "unsigned_divide": (lambda a, b: (lax.div(a, b), lax.rem(a, b)), np.uint32),
    # Shifts by the width or more: 0, or the sign for an arithmetic shift.
    "shifts": (lambda a, b: (lax.shift_left(a, b & 63), lax.shift_right_arithmetic(a, b & 63),
                             lax.shift_right_logical(a, b & 63)), np.int32),
    "bits": (lambda a, b: (lax.population_count(a), lax.clz(a ^ b)), np.int32),
    "narrow": (lambda a, b: (lax.div(a, b), lax.shift_right_logical(a, b & 15)), np.int16),
}


@pytest.mark.parametrize("name", sorted(INT_CHAINS))
def test_integer_chains_are_exact(monkeypatch, name):
    f, dtype = INT_CHAINS[name]
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, N, endpoint=True, dtype=dtype)
    b = rng.integers(max(info.min, -9), 9, N, endpoint=True).astype(dtype)   # zeros included
    on_xla, on_numpy = on_both(monkeypatch, f, a, b)
    for x, n, want in zip(on_xla, on_numpy, cpu_leaves(f, a, b), strict=True):
        assert x.dtype == want.dtype
        np.testing.assert_array_equal(x, want)
        np.testing.assert_array_equal(n, want)


def test_float_to_int_conversion_saturates(monkeypatch):
    def f(x):
        big = jnp.exp(x) * 1e8
        return big.astype(jnp.int32), (big * 1e-6).astype(jnp.uint8), big > 2e8
    x = np.concatenate([X, [np.nan, np.inf, -np.inf, 88.0]]).astype(np.float32)
    on_xla, on_numpy = on_both(monkeypatch, f, x)
    for x_, n, want in zip(on_xla, on_numpy, cpu_leaves(f, x), strict=True):
        assert x_.dtype == want.dtype
        # exp may differ by an ulp between fusions, which moves the integers.
        np.testing.assert_allclose(x_.astype(np.float64), want, rtol=3e-7, atol=1)
        np.testing.assert_allclose(n.astype(np.float64), want, rtol=3e-6, atol=1)
    # Saturation and NaN -> 0, exactly.
    np.testing.assert_array_equal(on_xla[0][-4:], [0, 2**31 - 1, 0, 2**31 - 1])
    np.testing.assert_array_equal(on_xla[1][-4:], [0, 255, 0, 255])


def test_reduce_precision_and_bitcast(monkeypatch):
    def f(x):
        y = lax.reduce_precision(jnp.exp(x * 0.1), exponent_bits=5, mantissa_bits=10)
        return y, lax.bitcast_convert_type(jnp.tanh(x), jnp.int32) >> 3
    on_xla, on_numpy = on_both(monkeypatch, f, X)
    rounded, bits = cpu_leaves(f, X)
    # Rounded to float16's precision: an ulp of exp may move it by one f16 ulp.
    np.testing.assert_allclose(on_xla[0], rounded, rtol=1e-3)
    np.testing.assert_allclose(on_numpy[0], rounded, rtol=1e-3)
    assert np.mean(on_xla[0] == rounded) > 0.999
    np.testing.assert_allclose(on_xla[1], bits, atol=2)


def test_inputs_laid_out_transposed_broadcast_or_unaligned():
    """Inputs the Model holds transposed (F-order), broadcast rows and
    memory off a 64-byte boundary give the values of C-ordered inputs."""
    a = rng.standard_normal((500, 300)).astype(np.float32)
    bias = rng.standard_normal(300).astype(np.float32)
    program = compile_fn(lambda x, b: jnp.tanh(x + b) * jnp.exp(-x), a, bias)
    assert chain_runners(program) == ["run_on_xla"]
    engine = Engine(SMALL)
    want = engine.run(program, [a, bias])[0]
    np.testing.assert_array_equal(want, cpu_leaves(lambda x, b: jnp.tanh(x + b) * jnp.exp(-x), a, bias)[0])
    np.testing.assert_array_equal(engine.run(program, [np.asfortranarray(a), bias])[0], want)
    raw = np.empty(a.nbytes + 4, np.uint8)[4:]       # 4 bytes past numpy's alignment
    unaligned = raw.view(np.float32).reshape(a.shape)
    unaligned[...] = a
    np.testing.assert_array_equal(engine.run(program, [unaligned, bias])[0], want)
    np.testing.assert_array_equal(engine.run(program, [a[::-1][::-1], bias])[0], want)


def test_donated_input_is_written_in_place():
    from jax_ipu.compiler import compile_module
    from jax_ipu.stablehlo import import_module
    x = rng.standard_normal(N).astype(np.float32)
    text = jax.jit(lambda a: jnp.sin(a) * 3 + a, donate_argnums=0).lower(x).as_text()
    program = compile_module(import_module(text), SMALL)
    assert program.in_place == {0: 0} and chain_runners(program) == ["run_on_xla"]
    donated = x.copy()
    out = Engine(SMALL).run(program, [donated], frozenset({0}))[0]
    assert out is donated
    np.testing.assert_array_equal(out, cpu_leaves(lambda a: jnp.sin(a) * 3 + a, x)[0])


def test_what_stays_on_numpy(monkeypatch):
    small = X[:1000]
    assert "run_on_xla" not in chain_runners(compile_fn(jnp.tanh, small))          # too small
    assert "run_on_xla" not in chain_runners(compile_fn(lambda x: x * 2 + 1, X))   # numpy is fast at it
    half = X.astype(np.float16)
    # float16 ops whose values XLA need not give as numpy does: pow, atan2
    # (not IEEE operations), bitcasts (a NaN's payload), a unary op that
    # differs from numpy's on this host.
    assert "run_on_xla" not in chain_runners(compile_fn(lambda x: jnp.power(x, x), half))
    assert "run_on_xla" not in chain_runners(compile_fn(lambda x: jnp.arctan2(x, x + 1), half))
    assert "run_on_xla" not in chain_runners(compile_fn(
        lambda x: lax.bitcast_convert_type(x * 2, jnp.int16), half))
    assert "run_on_xla" not in chain_runners(compile_fn(                            # float32 rsqrt
        lambda x: (lax.rsqrt(x.astype(jnp.float32) + 2.0) * 3).astype(jnp.float16), half))
    monkeypatch.setattr(xla_chains, "_f16_op_agrees", lambda op: op != "tanh")
    assert "run_on_xla" not in chain_runners(compile_fn(lambda x: jnp.tanh(x * 2), half))
    assert "run_on_xla" in chain_runners(compile_fn(lambda x: jnp.exp(x * 2), half))
    monkeypatch.setattr(xla_chains, "_cpu", lambda: None)                           # JAX_PLATFORMS=ipu
    program = compile_fn(jnp.tanh, X)
    assert "run_on_xla" not in chain_runners(program)
    np.testing.assert_allclose(Engine(SMALL).run(program, [X])[0], np.tanh(X), rtol=1e-6)


def test_through_the_plugin_with_transformations(ipu):
    """vmap, grad and scan over chains XLA takes, dispatched as users do."""
    x = jax.device_put(np.resize(X, (400, 330)), ipu)

    def loss(w):
        return jnp.sum(jnp.tanh(w * x) ** 2 * jnp.exp(-w))
    grads = jax.jit(jax.vmap(jax.grad(loss)))(jnp.linspace(0.1, 1.0, 3))
    cpu_x = np.resize(X, (400, 330))
    want = jax.vmap(jax.grad(lambda w: jnp.sum(jnp.tanh(w * cpu_x) ** 2 * jnp.exp(-w))))(
        jnp.linspace(0.1, 1.0, 3))
    np.testing.assert_allclose(np.asarray(grads), np.asarray(want), rtol=2e-5)

    def step(c, _):
        return jnp.tanh(c * 1.1 + 0.1), jnp.sum(c)
    final, sums = jax.jit(lambda c: lax.scan(step, c, None, length=5))(x)
    final_cpu, sums_cpu = jax.jit(lambda c: lax.scan(step, c, None, length=5))(cpu_x)
    # The loop runs as one XLA:CPU executable rounding each op as the
    # reference does, where XLA:CPU makes c * 1.1 + 0.1 one fused multiply-add.
    np.testing.assert_allclose(np.asarray(final), np.asarray(final_cpu), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(sums), np.asarray(sums_cpu), rtol=1e-5)


def test_quick_runs_on_the_callers_thread_and_on_two_ipus(ipus):
    """A small program (run by whichever thread asks for it first) and
    programs on two IPUs at once all use XLA:CPU kernels safely."""
    f = jax.jit(lambda a: jnp.tanh(a) * jnp.exp(-a))
    want = cpu_leaves(lambda a: jnp.tanh(a) * jnp.exp(-a), X)[0]
    for _ in range(3):
        outs = [f(jax.device_put(X, d)) for d in ipus for _ in range(4)]
        assert outs[0].is_ready() in (True, False)      # may run it on this thread
        for o in outs:
            np.testing.assert_array_equal(np.asarray(o), want)


def test_chains_computing_the_same_share_one_executable(monkeypatch):
    """Executables are kept by what they compute (xla_chains._signature):
    the same chain over other tensors reuses one; another immediate, shape
    or dtype, or a large array differing in one element, does not."""
    def kernel(program):
        [k] = [s.compute_set.kernel for s in leaves(program.body)
               if isinstance(s, Execute) and isinstance(s.compute_set.kernel, codelets.ElementwiseChain)]
        return k
    device = jax.devices("cpu")[0]

    def signature(f, *args):
        k = kernel(compile_fn(f, *args))
        return xla_chains._signature(k, device, [r for r, s in enumerate(k.inputs) if hasattr(s, "tensor")], 0)
    same = signature(lambda x: jnp.tanh(x * 2), X)
    assert signature(lambda y: jnp.tanh(y * 2), Y) == same
    assert signature(lambda x: jnp.tanh(x * 3), X) != same
    assert signature(lambda x: jnp.tanh(x * 2), X[:-1]) != same
    assert signature(lambda x: jnp.tanh(x * 2), X.astype(np.float16)) != same
    a = np.zeros(5000, np.float32)
    b = a.copy()
    b[2500] = 1
    assert xla_chains._key((("value", a),)) != xla_chains._key((("value", b),))
    # Two programs with the chain: one compile, the same values.
    monkeypatch.setattr(xla_chains, "_EXECUTABLES", type(xla_chains._EXECUTABLES)())
    engine = Engine(SMALL)
    outs = [engine.run(compile_fn(lambda x: jnp.tanh(x * 2) + 1, v), [v])[0] for v in (X, Y)]
    assert len(xla_chains._EXECUTABLES) == 1
    np.testing.assert_array_equal(outs[1], cpu_leaves(lambda x: jnp.tanh(x * 2) + 1, Y)[0])


def test_float16_max_of_signed_zeros_is_xla_cpus(monkeypatch):
    """The one place a float16 chain on XLA differs from the numpy kernel's
    bits: max and min of zeros of both signs, where numpy returns its first
    operand and XLA orders -0 below +0. The XLA path then gives XLA:CPU's
    own answer (relu(-0.0) is +0.0), as float32 chains on XLA do."""
    x = np.resize(np.array([-0.0, 0.0, -1.0, 2.0], np.float16), N)
    f = lambda x: jnp.maximum(x * 1.0, 0.0) + jnp.minimum(x, -0.0) * 0.0   # noqa: E731
    on_xla, on_numpy = on_both(monkeypatch, f, x)
    [want] = cpu_leaves(f, x)
    np.testing.assert_array_equal(on_xla[0].view(np.uint16), np.asarray(want).view(np.uint16))
    np.testing.assert_array_equal(on_xla[0], on_numpy[0])             # equal as numbers
