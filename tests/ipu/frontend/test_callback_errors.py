"""A host callback's error is raised by the call of the program that calls
it, as on XLA:CPU (whose callbacks run inside the call): a bare `f(x)`
fails, with the callback's own exception type and message, and leaves no
buffers behind; the device runs the next program. Programs with feeds
return at once, so their callbacks' errors reach their results instead."""
import gc
import logging
import signal
import threading

import jax
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ipu.frontend.callbacks import WAITS_FOR_HOST
from jax_ipu.model.fast import loops


def _fails(*args):
    raise ValueError("no good value")


def _calls(kind, x):
    """x plus what a failing callback of `kind` gives (nothing, for a
    debug.callback)."""
    result = jax.ShapeDtypeStruct((), np.float32)
    if kind == "debug":
        jax.debug.callback(_fails, x)
        return x + 1
    if kind == "pure":
        return x + jax.pure_callback(_fails, result, x.sum())
    return x + io_callback(_fails, result, x.sum(), ordered=kind == "io_ordered")


def _live(devices):
    """The bytes the live buffers take on each device (an output the call
    made and did not hand out, or did not release, would count). Arrays
    of earlier tests that only the collector frees are freed first."""
    gc.collect()
    return [d.memory_stats()["bytes_in_use"] for d in devices]


@pytest.mark.parametrize("kind", ["debug", "io_unordered", "io_ordered", "pure"])
def test_a_failing_callback_fails_the_call(ipu, kind):
    f = jax.jit(lambda x: _calls(kind, x) * 2)
    x = jax.device_put(np.ones(3, np.float32), ipu)
    before = _live([ipu])
    for _ in range(2):
        with pytest.raises(jax.errors.JaxRuntimeError, match="ValueError: no good value"):
            f(x)          # no block_until_ready: the call itself raises
        jax.effects_barrier()       # and the error is not raised again
        assert _live([ipu]) == before
    g = jax.jit(lambda x: x * 2 + jax.pure_callback(np.negative, jax.ShapeDtypeStruct((3,), np.float32), x))
    np.testing.assert_array_equal(np.asarray(g(x)), np.ones(3))
    jax.effects_barrier()


@pytest.mark.parametrize("where", ["executable", "engine", "sort"])
def test_a_callback_failing_in_a_loop_fails_the_call(ipu, monkeypatch, where):
    """The loop as one XLA:CPU executable, on the engine's steps, and on
    the engine's steps because it holds a sort (no translation)."""
    calls, translated = [], []
    real = loops.translated

    def spy(step, *args, **kwargs):
        fn = real(step, *args, **kwargs)
        translated.append(fn is not None)
        return fn
    monkeypatch.setattr(loops, "translated", spy)
    monkeypatch.setattr(loops, "MIN_ITERATIONS", 0)     # translated from the first iteration
    monkeypatch.setattr(loops, "XLA_LOOPS", where != "engine")

    def check(i):
        calls.append(int(i))
        if i == 3:
            raise ValueError("iteration 3 is not allowed")
        return np.float32(i)

    def body(i, x):
        if where == "sort":
            x = lax.sort(x[::-1])
        return x + jax.pure_callback(check, jax.ShapeDtypeStruct((), np.float32), i)
    f = jax.jit(lambda x, n: lax.fori_loop(0, n, body, x))
    x, n = jax.device_put(np.arange(4, dtype=np.float32), ipu), jax.device_put(np.int32(6), ipu)
    before = _live([ipu])
    with pytest.raises(jax.errors.JaxRuntimeError, match="ValueError: iteration 3 is not allowed"):
        f(x, n)
    assert calls == [0, 1, 2, 3]
    assert translated == {"executable": [True], "engine": [False], "sort": [False]}[where]
    assert _live([ipu]) == before
    np.testing.assert_array_equal(np.asarray(f(x, jax.device_put(np.int32(3), ipu))), np.arange(4) + 3)


@pytest.mark.parametrize("how", ["pmap", "sharded jit", "shard_map"])
def test_a_callback_failing_on_two_ipus_fails_the_call(ipus, how):
    """pmap and shard_map call the host on every IPU; a sharded jit once for
    both (the first partition calls, the other fails with its error): the
    call raises the callback's own error, not another IPU's report of it."""
    devices = ipus[:2]
    mesh = Mesh(np.array(devices), ("i",))
    if how == "pmap":
        f = jax.pmap(lambda x: _calls("pure", x), devices=devices)
        x = jax.pmap(lambda v: v, devices=devices)(np.ones((2, 3), np.float32))
    else:
        x = jax.device_put(np.ones(8, np.float32), NamedSharding(mesh, P("i")))
        f = jax.jit(lambda x: _calls("io_ordered", x) if how == "sharded jit" else
                    jax.shard_map(lambda v: _calls("pure", v), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x))
    before = _live(devices)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL: ValueError: no good value") as info:
        f(x)
    assert "partition" not in str(info.value) and "replica" not in str(info.value)
    jax.effects_barrier()
    assert _live(devices) == before
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v + 1)(x)), np.asarray(x) + 1)


@pytest.fixture
def python_handles_ctrl_c(request):
    # Python's own Ctrl-C handler, as in a terminal: a process started with
    # SIGINT ignored (e.g. pytest run from `cmd &` in a script) never gets
    # the interrupt the call raises again.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))


def test_ctrl_c_in_a_callback_reaches_the_caller(ipu, python_handles_ctrl_c):
    def interrupted(v):
        raise KeyboardInterrupt("stop")
    f = jax.jit(lambda x: x + jax.pure_callback(interrupted, jax.ShapeDtypeStruct((), np.float32), x.sum()))
    x = jax.device_put(np.ones(2, np.float32), ipu)
    before = _live([ipu])
    with pytest.raises(KeyboardInterrupt):
        try:
            f(x)
        except jax.errors.JaxRuntimeError as error:   # (when Ctrl-C lands after the call's own error)
            assert "KeyboardInterrupt: stop" in str(error)
        for _ in range(100000):     # Ctrl-C lands at a bytecode boundary
            pass
    assert _live([ipu]) == before
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v * 3)(x)), np.full(2, 3.0))


def test_ctrl_c_while_the_call_waits_leaves_the_run_going(ipu, python_handles_ctrl_c):
    """Ctrl-C while a call waits for its callback: the caller is
    interrupted, the run ends by itself, and nothing is left behind."""
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def slow(v):
        started.set()
        release.wait(60)
        ended.set()
        return v

    def interrupt():
        started.wait(60)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    f = jax.jit(lambda x: x + jax.pure_callback(slow, jax.ShapeDtypeStruct((2,), np.float32), x))
    x = jax.device_put(np.ones(2, np.float32), ipu)
    before = _live([ipu])
    thread = threading.Thread(target=interrupt)
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        f(x)
    thread.join()
    release.set()
    assert ended.wait(60)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v * 3)(x)), np.full(2, 3.0))  # after the run
    assert _live([ipu]) == before


def test_a_program_that_returns_at_once_gives_the_error_to_its_results(ipu):
    """A callback that may wait for what the caller does next (a feed's,
    marked WAITS_FOR_HOST) makes its program's call return at once: the
    error reaches the results, read later."""
    def fails(v):
        raise ValueError("no item")
    setattr(fails, WAITS_FOR_HOST, True)
    f = jax.jit(lambda x: x + io_callback(fails, jax.ShapeDtypeStruct((), np.float32), x.sum(), ordered=True))
    x = jax.device_put(np.ones(2, np.float32), ipu)
    out = f(x)
    with pytest.raises(jax.errors.JaxRuntimeError, match="ValueError: no item"):
        np.asarray(out)
    jax.effects_barrier()


def test_a_program_run_by_a_callback_on_its_own_ipu_raises_its_callbacks_error(ipu, monkeypatch):
    """The inner program runs in place, on the outer run's thread; its
    failing callback fails the inner call, which the outer callback may
    catch, as on XLA:CPU."""
    # JAX logs the failure with its traceback, whose frames lead back to
    # the outer callback's (pytest keeps the records, and so the inner
    # call's argument, for the test's length).
    monkeypatch.setattr(logging.getLogger("jax._src.callback"), "disabled", True)
    inner = jax.jit(lambda v: _calls("io_unordered", v))
    caught = []

    def outer_host(v):
        try:
            inner(jax.device_put(np.asarray(v), ipu))
        except jax.errors.JaxRuntimeError as error:
            caught.append(str(error))
        return v * 2
    f = jax.jit(lambda x: jax.pure_callback(outer_host, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1)
    x = jax.device_put(np.ones(3, np.float32), ipu)
    before = _live([ipu])
    np.testing.assert_array_equal(np.asarray(f(x)), np.full(3, 3.0))
    assert len(caught) == 1 and "ValueError: no good value" in caught[0], caught
    assert _live([ipu]) == before
