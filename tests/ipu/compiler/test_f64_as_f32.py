"""JAX_IPU_F64_AS_F32 (and jax_ipu.set_f64_as_f32): programs traced with
jax_enable_x64 run with 32-bit arithmetic on the IPU while JAX sees 64-bit
arrays. Results are checked against XLA:CPU in float64 with f32-level
tolerances (rtol 1e-5, atol 1e-5); integer results exactly. Without the
opt-in, 64-bit types stay a clear error. x64 is process-wide, so each case
runs in a fresh interpreter."""
from __future__ import annotations

import textwrap

import pytest

from helpers import run_python
from jax_ipu import config

PRELUDE = """
import functools
import jax, jax.numpy as jnp, numpy as np, jax_ipu
jax.config.update("jax_enable_x64", True)
ipu, cpu = jax.devices("ipu")[0], jax.devices("cpu")[0]
rng = np.random.default_rng(0)
"""


def _run(body: str, **env):
    result = run_python(PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n", **env)
    assert result.returncode == 0 and result.stdout.rstrip().endswith("ok"), (
        result.stdout[-3000:] + result.stderr[-3000:])
    return result.stdout


def test_programs_match_cpu_at_f32_precision():
    _run("""
    a, b = rng.standard_normal((6, 6)), rng.standard_normal(6)
    PROGRAMS = {
        "elementwise": lambda a, b: jnp.sin(a) * jnp.exp(-a * a) + b,
        "matmul": lambda a, b: a @ a.T @ b,
        "solve": lambda a, b: jnp.linalg.solve(a @ a.T + 6 * jnp.eye(6), b),
        "eigh": lambda a, b: jnp.linalg.eigh(a @ a.T)[0],
        "reductions": lambda a, b: (a.sum(), a.max(axis=0), jnp.mean(a, axis=1)),
        "int64": lambda a, b: (jnp.argmax(a, axis=1), jnp.arange(6) * 3 - 7, jnp.argsort(b)),
        "indexing": lambda a, b: a[jnp.argsort(b)][:, 2],
        "scan": lambda a, b: jax.lax.scan(lambda c, x: (0.5 * c + x, c), 0.0, b),
        "grad": lambda a, b: jax.grad(lambda a: jnp.sum(jnp.tanh(a @ b)))(a),
        "int_sentinels": lambda a, b: (jnp.min(jnp.arange(6)), jnp.nanargmin(b), jnp.max(jnp.arange(5))),
    }
    for name, f in PROGRAMS.items():
        got = jax.jit(f)(jax.device_put(a, ipu), jax.device_put(b, ipu))
        want = jax.jit(f)(jax.device_put(a, cpu), jax.device_put(b, cpu))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert g.dtype == w.dtype and g.dtype.itemsize == 8, (name, g.dtype, w.dtype)
            assert g.devices() == {ipu}, name
            if w.dtype.kind == "f":
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5, err_msg=name)
            else:
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name)
    """, JAX_IPU_F64_AS_F32="1")


def test_transfers_round_trip_and_range():
    _run("""
    x = rng.standard_normal((3, 5))
    y = jax.device_put(x, ipu)
    assert y.dtype == np.float64 and y.shape == (3, 5)
    np.testing.assert_array_equal(np.asarray(y), x.astype(np.float32).astype(np.float64))
    assert np.asarray(y).dtype == np.float64
    np.testing.assert_array_equal(np.asarray(y.T), x.astype(np.float32).astype(np.float64).T)
    i = np.array([-2**31, -1, 0, 2**31 - 1], np.int64)
    np.testing.assert_array_equal(np.asarray(jax.device_put(i, ipu)), i)
    u = np.array([0, 2**32 - 1], np.uint64)
    np.testing.assert_array_equal(np.asarray(jax.device_put(u, ipu)), u)
    before = jax_ipu.transfer_stats(ipu)["host_to_device_bytes"]
    jax.device_put(np.zeros(100), ipu).block_until_ready()
    assert jax_ipu.transfer_stats(ipu)["host_to_device_bytes"] - before == 400   # held as f32
    try:
        jax.device_put(np.array([2**40]), ipu)
        raise SystemExit("an int64 beyond int32's range was placed")
    except Exception as exc:
        assert "does not fit" in str(exc), exc
    """, JAX_IPU_F64_AS_F32="1")


def test_donation_still_aliases():
    _run("""
    @functools.partial(jax.jit, donate_argnums=0)
    def step(w, g):
        return w - 0.5 * g
    w = jax.device_put(np.ones((32, 32)), ipu)
    g = jax.device_put(np.full((32, 32), 0.25), ipu)
    new = step(w, g)
    assert w.is_deleted()
    assert new.dtype == np.float64
    np.testing.assert_allclose(np.asarray(new), np.full((32, 32), 0.875), rtol=1e-7)
    """, JAX_IPU_F64_AS_F32="1")


def test_host_callbacks_may_return_64_bit_values():
    _run("""
    def host(x):
        return np.asarray(x, np.float64) * 2
    f = jax.jit(lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1)
    np.testing.assert_allclose(np.asarray(f(jax.device_put(np.arange(4.0), ipu))), [1, 3, 5, 7])
    """, JAX_IPU_F64_AS_F32="1")


def test_bit_level_ops_of_64_bit_values_are_refused_64_bit_randoms_run_as_32_bit():
    _run("""
    key = jax.device_put(jax.random.key(0), ipu)
    try:
        jax.jit(lambda x: jax.lax.bitcast_convert_type(x, jnp.int64))(jax.device_put(np.ones(2), ipu))
        raise SystemExit("a float64 bitcast ran")
    except Exception as exc:
        assert "stablehlo.bitcast_convert" in str(exc) and "bits of a 64-bit value" in str(exc), exc
    x = jax.device_put(np.arange(2), ipu)
    try:     # per-element amounts of 32 or more: refused
        jax.jit(lambda x: x << jnp.array([1, 40]))(x)
        raise SystemExit("an int64 shift by 40 ran")
    except Exception as exc:
        assert "shift" in str(exc) and "32 bits or more" in str(exc), exc
    x = jax.device_put(np.array([-5, 0, 7, 1 << 20]), ipu)
    want = [np.asarray(x) << 3, np.asarray(x) >> 33, (np.asarray(x).astype(np.uint64) >> np.uint64(40)).astype(np.int64)]
    got = jax.jit(lambda x: (x << 3, x >> 33, jax.lax.shift_right_logical(x, jnp.int64(40))))(x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)
    # float64 samplers draw float32 values (uniforms from 32 random bits),
    # int64 ones 32-bit words; a key from an int64 seed matches the CPU's.
    draws = jax.jit(lambda k: [f(s, (20000,)) for f, s in zip(
        (jax.random.uniform, jax.random.normal, lambda s, n: jax.random.bernoulli(s, 0.3, n),
         lambda s, n: jax.random.randint(s, n, 0, 10)), jax.random.split(k, 4))])
    u, n, b, r = (np.asarray(a) for a in draws(key))
    assert u.dtype == n.dtype == np.float64 and r.dtype == np.int64
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    assert abs(b.mean() - 0.3) < 0.015 and set(np.unique(r)) == set(range(10))
    seeds = jax.jit(lambda: [jax.random.key_data(jax.random.key(s)) for s in (-5, 7, 2**31 - 1)])
    with jax.default_device(cpu):
        want = seeds()
    with jax.default_device(ipu):
        got = seeds()
    assert got[0].devices() == {ipu}
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    f = jax.jit(lambda k: jax.random.randint(k, (64,), 0, 10, dtype=jnp.int32))
    np.testing.assert_array_equal(np.asarray(f(key)), np.asarray(f(jax.device_put(jax.random.key(0), cpu))))
    f = jax.jit(lambda k: jax.random.normal(k, (64,), dtype=jnp.float32))
    np.testing.assert_allclose(np.asarray(f(key)), np.asarray(f(jax.device_put(jax.random.key(0), cpu))),
                               rtol=1e-5, atol=1e-6)
    """, JAX_IPU_F64_AS_F32="1")


def test_without_the_opt_in_64_bit_types_are_refused():
    _run("""
    try:
        jax.device_put(np.ones(3), ipu)
        raise SystemExit("float64 was placed")
    except Exception as exc:
        assert "float64" in str(exc) and "JAX_IPU_F64_AS_F32" in str(exc), exc
    x = jax.device_put(np.ones(3, np.float32), ipu)
    try:
        jax.jit(lambda x: x.astype(jnp.float64) * 2)(x)
        raise SystemExit("a float64 program compiled")
    except Exception as exc:
        assert "no f64 type" in str(exc) and "stablehlo." in str(exc) and "<string>:" in str(exc), exc
        assert "JAX_IPU_F64_AS_F32" in str(exc), exc
    """)


def test_python_switch():
    _run("""
    assert jax_ipu.set_f64_as_f32(True) is False
    x = rng.standard_normal(8)
    got = jax.jit(lambda x: jnp.cumsum(x) / 3)(jax.device_put(x, ipu))
    np.testing.assert_allclose(np.asarray(got), np.cumsum(x) / 3, rtol=1e-5, atol=1e-6)
    assert got.dtype == np.float64
    assert jax_ipu.set_f64_as_f32(False) is True
    try:
        jax.device_put(x, ipu)
        raise SystemExit("float64 was placed after the switch went off")
    except Exception as exc:
        assert "float64" in str(exc), exc
    """)


@pytest.mark.parametrize("text,expected", [("1", True), ("0", False), (None, False)])
def test_setting(text, expected):
    env = {} if text is None else {"JAX_IPU_F64_AS_F32": text}
    assert config.from_environment(env).f64_as_f32 is expected


def test_setting_rejects_nonsense():
    with pytest.raises(Exception, match="JAX_IPU_F64_AS_F32"):
        config.from_environment({"JAX_IPU_F64_AS_F32": "maybe"})


def test_integer_constants_beyond_32_bits_are_refused_at_their_line_sentinels_run():
    _run("""
    x = jax.device_put(np.arange(4), ipu)
    for f, text in ((lambda a: a + 2**33, "8589934592"),                       # reader line A
                    (lambda a: jax.lax.fori_loop(0, 2, lambda i, c: c * 3 + (1 << 40), a), "1099511627776")):
        try:
            jax.jit(f)(x)
            raise SystemExit("a constant beyond 32 bits ran")
        except SystemExit:
            raise
        except Exception as exc:
            message = str(exc)
            assert f"the int64 constant {text} does not fit 32 bits" in message, message
            assert "test_f64_as_f32" not in message and "<string>:" in message, message   # the user's line
    try:
        jax.jit(lambda k: jax.random.randint(k, (8,), 0, 2**33))(jax.device_put(jax.random.key(0), ipu))
        raise SystemExit("randint up to 2**33 ran")
    except SystemExit:
        raise
    except Exception as exc:
        assert "does not fit 32 bits" in str(exc) and "randint" in str(exc), exc
    # int64's limits (argmin's, randint's clamps), 2**32 (randint's word base)
    # and 32-bit patterns still run.
    a = rng.standard_normal((5, 9))
    f = jax.jit(lambda a, k: (jnp.argmin(a, 1), jnp.argmax(a), jax.random.randint(k, (4000,), -3, 5),
                              (jnp.arange(4) + 0xFFFFFFF0) & 0xFFFFFFFF))
    i, j, r, m = (np.asarray(v) for v in f(jax.device_put(a, ipu), jax.device_put(jax.random.key(1), ipu)))
    np.testing.assert_array_equal(i, np.argmin(a, 1))
    assert j == np.argmax(a) and set(np.unique(r)) == set(range(-3, 5))
    np.testing.assert_array_equal(m, np.arange(4) - 16)   # int32 wrap of 0xFFFFFFF0 + i
    """, JAX_IPU_F64_AS_F32="1")


def test_64_bit_shifts_by_amounts_known_only_at_run_time_are_refused():
    # srl(int64 -1, 40) is 2**24 - 1; run as 32 bits it would be 0, silently.
    _run("""
    x = jax.device_put(np.array([3, -1, 2]), ipu)
    try:
        jax.jit(lambda v, s: jax.lax.shift_right_logical(v, s))(x, jax.device_put(np.array([40, 40, 40]), ipu))
        raise SystemExit("a 64-bit shift by a run-time amount ran")
    except SystemExit:
        raise
    except Exception as exc:
        message = str(exc)
        assert "shift_right_logical at <string>:" in message and "known only at run time" in message, message
    # constant amounts run, as the CPU computes them
    for f in (lambda v: jax.lax.shift_right_logical(v, jnp.int64(40)), lambda v: v << 3, lambda v: v >> 2):
        got = np.asarray(jax.jit(f)(x))
        want = np.asarray(jax.jit(f)(jax.device_put(np.array([3, -1, 2]), jax.devices("cpu")[0])))
        np.testing.assert_array_equal(got, want)
    """, JAX_IPU_F64_AS_F32="1")
