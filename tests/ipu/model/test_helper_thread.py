"""The IPU Model's helper thread: it takes half of a large kernel when a
core is free, spinning between hand-offs only while a run shares work, and
errors in either half reach the caller."""
from __future__ import annotations

import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

from helpers import compile_fn
from jax_ipu.model.fast import helper

pytestmark = pytest.mark.skipif(helper.spinner() is None, reason="needs libc spinlocks and 2 cores")


@pytest.fixture
def free_core(monkeypatch):
    monkeypatch.setattr(helper, "spare_core", lambda: True)
    yield
    helper.end_session()


def _cpu_seconds(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_second_half_runs_on_the_spinning_helper(free_core):
    ran_on = []
    started = threading.Event()

    def first():
        started.wait(5)              # the helper takes the second half meanwhile
        ran_on.append(threading.current_thread().name)

    def second():
        started.set()
        ran_on.append(threading.current_thread().name)
    helper.run_halves(first, second)
    assert sorted(ran_on) == sorted([threading.current_thread().name, "ipu-model-helper-spin"])
    assert helper.spinner().owner == threading.get_ident()
    assert helper.end_session() is True          # the run handed it work
    assert helper.spinner().owner is None
    assert helper.end_session() is False


def test_errors_in_either_half_reach_the_caller_and_the_helper_goes_on(free_core):
    def boom():
        raise ValueError("second half")
    with pytest.raises(ValueError, match="second half"):
        helper.run_halves(lambda: None, boom)
    done, started = [], threading.Event()

    def first():
        started.wait(5)
        raise KeyError("first half")

    def second():
        started.set()
        time.sleep(0.05)
        done.append(1)
    with pytest.raises(KeyError):
        helper.run_halves(first, second)
    assert done == [1]                            # the caller waited for the helper's half
    helper.run_halves(lambda: done.append(2), lambda: done.append(3))
    assert sorted(done) == [1, 2, 3]


def test_the_helper_does_not_spin_between_runs(free_core):
    helper.run_halves(lambda: None, lambda: None)
    helper.end_session()
    tid = helper.spinner()._thread.native_id
    before = _cpu_seconds(tid)
    time.sleep(0.5)
    assert _cpu_seconds(tid) - before < 0.1


def test_a_second_thread_does_not_get_the_spinner_while_another_run_has_it(free_core):
    helper.run_halves(lambda: None, lambda: None)      # this thread's run has the spinner
    results = {}

    def other():
        parts = [None, None]
        helper.run_halves(lambda: parts.__setitem__(0, threading.current_thread().name),
                          lambda: parts.__setitem__(1, threading.current_thread().name))
        results["names"] = parts
        helper.end_session()
    t = threading.Thread(target=other, name="other-device")
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert "ipu-model-helper-spin" not in results["names"]
    assert results["names"][0] == "other-device"


def test_a_host_callback_stops_the_spinning(monkeypatch):
    """A run whose big matmul shared work and which then waits in a host
    callback does not keep a core busy while it waits."""
    monkeypatch.setattr(helper, "spare_core", lambda: True)
    spin = helper.spinner()
    seen = {}

    def wait(x):
        tid = spin._thread.native_id
        before = _cpu_seconds(tid)
        time.sleep(0.5)
        seen["helper_cpu"] = _cpu_seconds(tid) - before
        seen["owner"] = spin.owner
        return x

    @jax.jit
    def f(x, w):
        y = jnp.tanh(x @ w)
        y = io_callback(wait, jax.ShapeDtypeStruct(y.shape, y.dtype), y)
        return y @ w

    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    w = (rng.standard_normal((512, 512)) / 20).astype(np.float32)
    ipu = jax.devices("ipu")[0]
    out = f(jax.device_put(x, ipu), jax.device_put(w, ipu))
    np.testing.assert_allclose(np.asarray(out), np.tanh(x @ w) @ w, rtol=1e-4, atol=1e-4)
    assert seen["owner"] is None
    assert seen["helper_cpu"] < 0.1


def _fn(shares=False):
    def fn(state):
        pass
    fn.shares = shares
    return fn


def test_the_helper_is_woken_ahead_of_shared_work_and_sleeps_through_long_solo_stretches():
    from jax_ipu.model.fast.straight_line import IDLE_US, PREWAKE_US, helper_schedule
    solo = PREWAKE_US / 3
    steps = ([(solo, False)] * 6 + [(1000, True)]        # woken about PREWAKE_US ahead of the first
             + [(solo, False)] * 2 + [(1000, True)]       # a short stretch: it keeps spinning
             + [(IDLE_US, False)] * 2 + [(1000, True)]    # a long one: it sleeps, woken again ahead
             + [(solo, False)] * 3)                       # and sleeps after the last
    wake, rest = helper_schedule([_fn(shares) for _, shares in steps], [us for us, _ in steps])
    assert wake == {3, 11} and rest == {9, 12}
    assert helper_schedule([_fn()] * 4, [solo] * 4) == (set(), set())


def test_a_straight_line_program_times_its_first_runs_then_follows_the_schedule(monkeypatch):
    """Its steps' times come from its own first runs (TIMED_RUNS), donated
    or not; then the generated program wakes and rests the helper."""
    from jax_ipu.model import engine
    from jax_ipu.model.fast.straight_line import TIMED_RUNS
    monkeypatch.setattr(helper, "spare_core", lambda: True)
    from jax_ipu.targets import get_target
    ipu2 = get_target("ipu2")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    w = (rng.standard_normal((512, 512)) / 20).astype(np.float32)

    def f(x, w):
        h = jnp.tanh(x @ w)
        for _ in range(3):
            h = jnp.tanh(h + 1.0) * 0.5
        return (h @ w).sum(0), w * 0.5
    program = compile_fn(f, x, w, target=ipu2)
    eng = engine.Engine(ipu2)
    loaded = eng.load(program)
    assert loaded.timed_runs == TIMED_RUNS
    cpu = jax.devices("cpu")[0]
    want = [np.asarray(v) for v in jax.jit(f)(jax.device_put(x, cpu), jax.device_put(w, cpu))]
    for _ in range(TIMED_RUNS + 1):
        got = eng.run(program, [x.copy(), w.copy()], donated=frozenset({1}), checked=False)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-3)
        np.testing.assert_array_equal(got[1], want[1])
    assert loaded.timed_runs == 0 and all(t < float("inf") for t in loaded.step_us)
    helper.end_session()


def test_runnable_threads_read_from_a_kept_descriptor_of_proc_loadavg(monkeypatch):
    """The spare-core check reads the kernel's count of runnable threads at
    offset 0 of a descriptor it keeps (fresh figures on every read); where
    it cannot, it assumes this thread alone."""
    with open("/proc/loadavg", "rb") as f:
        total = int(f.read().split()[3].split(b"/")[1])
    first = helper.runnable_threads()
    assert 1 <= first <= total + 64          # this thread runs: at least itself
    fd = helper._loadavg[0]
    assert helper.runnable_threads() >= 1 and helper._loadavg == [fd]     # the same descriptor, read again
    monkeypatch.setattr(helper, "_loadavg", [])
    monkeypatch.setattr(helper.os, "open", lambda *a, **k: (_ for _ in ()).throw(OSError("no")))
    assert helper.runnable_threads() == 1
