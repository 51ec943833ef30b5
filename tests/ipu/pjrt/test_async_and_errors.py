"""Asynchronous dispatch, and the boundary's promise: every failure is a
Python exception, never an abort or a hang."""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import run_python


def ipu_device_object(ipu):
    from jax_ipu.pjrt import client
    return client.CURRENT.device(ipu.id)


def test_execute_returns_before_the_program_finishes(ipu, monkeypatch):
    engine = ipu_device_object(ipu).engine
    gate = threading.Event()
    real_run = engine.run

    def gated_run(*args, **kwargs):
        assert gate.wait(60)
        return real_run(*args, **kwargs)

    # A loop: not a quick run (those run on the first thread that asks about
    # their results; tests/ipu/pjrt/test_quick_dispatch.py shows them asynchronous).
    f = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, v: v + 1.0, x) - 2)
    x = jax.device_put(np.zeros(4, np.float32), ipu)
    f(x).block_until_ready()  # compiled before gating
    monkeypatch.setattr(engine, "run", gated_run)
    y = f(x)  # returns although the device cannot run yet
    assert not y.is_ready()
    gate.set()
    y.block_until_ready()
    assert y.is_ready()
    np.testing.assert_array_equal(np.asarray(y), np.ones(4))


def test_error_while_running_reaches_the_user_at_the_sync_point(ipu, monkeypatch):
    def failing_run(*args, **kwargs):
        raise RuntimeError("simulated tile fault")

    f = jax.jit(lambda x: x * 3)
    x = jax.device_put(np.ones(4, np.float32), ipu)
    f(x).block_until_ready()
    monkeypatch.setattr(ipu_device_object(ipu).engine, "run", failing_run)
    y = f(x)
    with pytest.raises(Exception, match="simulated tile fault"):
        y.block_until_ready()
    with pytest.raises(Exception, match="simulated tile fault"):
        np.asarray(f(x))
    monkeypatch.undo()
    np.testing.assert_array_equal(np.asarray(f(x)), np.full(4, 3.0))  # the device still works


# The IPU emulates complex64 by default: these programs ask for native types only.
NATIVE = {"emulate_types": False}


def test_unsupported_dtype_fails_at_compile_time_naming_op_and_line(ipu):
    def f(x):
        return x.astype(jnp.complex64).imag  # the IPU has no complex type
    x = jax.device_put(np.ones(8, np.float32), ipu)
    with pytest.raises(Exception) as info:
        jax.jit(f).lower(x).compile(compiler_options=NATIVE)
    text = str(info.value)
    line = f.__code__.co_firstlineno + 1
    assert "stablehlo.convert" in text and "complex" in text
    assert f"test_async_and_errors.py:{line}" in text


def test_op_inside_a_called_function_is_placed_at_the_users_line(ipu):
    # JAX gives the ops of jnp.fft's private function only the name "fft":
    # the error names the user's call of it instead.
    def f(x):
        return jnp.fft.rfft(x)
    x = jax.device_put(np.ones(8, np.float32), ipu)
    with pytest.raises(Exception) as info:
        jax.jit(f).lower(x).compile(compiler_options=NATIVE)
    text = str(info.value)
    assert "stablehlo.fft" in text and "complex" in text
    assert f"test_async_and_errors.py:{f.__code__.co_firstlineno + 1}" in text


def test_wrong_device_argument_raises(ipus):
    a = jax.device_put(np.ones(3, np.float32), ipus[0])
    b = jax.device_put(np.ones(3, np.float32), ipus[1])
    with pytest.raises(ValueError):
        jax.jit(lambda a, b: a + b)(a, b)


def test_exception_unwinding_while_ipu_arrays_are_freed():
    code = """
import jax, numpy as np
ipu = jax.devices('ipu')[0]
f = jax.jit(lambda x: x * 2)
def work():
    arrays = [f(jax.device_put(np.full(16, i, np.float32), ipu)) for i in range(300)]
    raise KeyError('user error with %d live IPU arrays' % len(arrays))
for _ in range(3):
    try:
        work()
    except KeyError as e:
        print('caught', e)
arrays = [jax.device_put(np.ones(4, np.float32), ipu) for _ in range(100)]
raise SystemExit('exiting with live arrays')
"""
    result = run_python(code)
    assert result.stdout.count("caught") == 3, result.stderr
    assert result.returncode == 1, result.stderr  # SystemExit's message, not SIGABRT (-6)
    assert "exiting with live arrays" in result.stderr


def test_uncaught_exception_with_live_arrays_exits_cleanly():
    code = """
import jax, numpy as np
ipu = jax.devices('ipu')[0]
xs = [jax.jit(lambda x: x + 1)(jax.device_put(np.ones(8, np.float32), ipu)) for _ in range(50)]
raise ValueError('boom')
"""
    result = run_python(code)
    assert result.returncode == 1
    assert "ValueError: boom" in result.stderr
    assert "Check failure" not in result.stderr


def test_eight_threads_calling_at_once(ipus):
    fs = [jax.jit(lambda x, k=k: x * k + 1) for k in range(4)]
    errors, counts = [], [0] * 8
    stop = threading.Event()

    def worker(i):
        device = ipus[i % len(ipus)]
        rng = np.random.default_rng(i)
        try:
            while not stop.is_set():
                k = int(rng.integers(4))
                x = rng.standard_normal(16).astype(np.float32)
                y = fs[k](jax.device_put(x, device))
                np.testing.assert_allclose(np.asarray(y), x * k + 1, rtol=1e-6)
                assert y.devices() == {device}
                counts[i] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    stop.wait(4.0)
    stop.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[0]
    assert all(c > 0 for c in counts)


def test_a_compiler_bug_is_reported_with_the_op_and_line(ipu, monkeypatch):
    import importlib
    lower = importlib.import_module("jax_ipu.compiler.passes.lower")  # the package re-exports lower()

    def broken_rule(b, op):
        raise ValueError("simulated compiler bug")
    monkeypatch.setitem(lower.RULES, "dot_general", broken_rule)

    def f(a):
        return a @ a  # the op the broken rule compiles
    with pytest.raises(Exception) as info:
        jax.jit(f)(jax.device_put(np.ones((3, 3), np.float32), ipu))
    text = str(info.value)
    assert text.startswith("INTERNAL") and "stablehlo.dot_general" in text
    assert f"test_async_and_errors.py:{f.__code__.co_firstlineno + 1}" in text
    assert "simulated compiler bug" in text and "jax-ipu bug" in text


def test_arguments_deleted_right_after_dispatch_are_still_used(ipu, monkeypatch):
    engine = ipu_device_object(ipu).engine
    gate = threading.Event()
    real_run = engine.run
    f = jax.jit(lambda x: x + 1)
    x = jax.device_put(np.arange(4, dtype=np.float32), ipu)
    f(x).block_until_ready()
    monkeypatch.setattr(engine, "run", lambda *a, **k: (gate.wait(60), real_run(*a, **k))[1])
    y = f(x)
    x.delete()  # JAX allows this: the pending run keeps what it needs
    gate.set()
    np.testing.assert_array_equal(np.asarray(y), np.arange(4) + 1)
