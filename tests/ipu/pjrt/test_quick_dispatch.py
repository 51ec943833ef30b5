"""Quick runs: small programs that cannot block are deferred for a short
grace and run by the next thread that needs the device (the next Execute,
a copy to the host, a wait on a buffer) or else by the device's worker.
Dispatch stays asynchronous; results, ordering, donation, errors and the
caller's numpy error state are as with any other run."""
import signal
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def device_object(ipu):
    from jax_ipu.pjrt import client
    return client.CURRENT.device(ipu.id)


def runs_by_thread(monkeypatch, ipu):
    """Counts runs per thread name. The worker's grace is made long, so that
    who runs a quick run does not depend on the machine's load."""
    from jax_ipu.pjrt import device
    monkeypatch.setattr(device.DeviceWorker, "GRACE_SECONDS", 60.0)
    counts: dict[str, int] = {}
    engine = device_object(ipu).engine
    real = engine.run

    def counted(*args, **kwargs):    # every run on the device runs its program here
        name = threading.current_thread().name
        counts[name] = counts.get(name, 0) + 1
        return real(*args, **kwargs)
    monkeypatch.setattr(engine, "run", counted)
    return counts


def test_back_to_back_small_runs_are_taken_by_the_dispatching_thread(ipu, monkeypatch):
    f = jax.jit(lambda x: x * 2 + 1)
    x = jax.device_put(np.arange(4, dtype=np.float32), ipu)
    f(x).block_until_ready()            # compiled, and seen to be quick
    counts = runs_by_thread(monkeypatch, ipu)
    y = x
    for _ in range(50):
        y = f(y)
    expected = np.arange(4, dtype=np.float32)
    for _ in range(50):
        expected = expected * 2 + 1
    np.testing.assert_array_equal(np.asarray(y), expected)
    # Each call ran its predecessor (or the copy to the host ran the last):
    # at most a few runs were left to the worker's grace.
    assert counts.get(threading.current_thread().name, 0) >= 45, counts
    assert sum(counts.values()) == 50


def test_a_deferred_run_completes_without_anyone_asking(ipu):
    f = jax.jit(lambda x: x - 3)
    x = jax.device_put(np.arange(6, dtype=np.int32), ipu)
    f(x).block_until_ready()
    worker = device_object(ipu).worker
    y = f(x)
    deadline = time.monotonic() + 10
    while worker._jobs and time.monotonic() < deadline:   # nobody asks JAX for y meanwhile
        time.sleep(0.001)
    assert not worker._jobs, "the worker never picked up the deferred run"
    np.testing.assert_array_equal(np.asarray(y), np.arange(6) - 3)


def test_quick_runs_stay_asynchronous(ipu, monkeypatch):
    engine = device_object(ipu).engine
    f = jax.jit(lambda x: x + 1)
    x = jax.device_put(np.zeros(4, np.float32), ipu)
    f(x).block_until_ready()
    events = []
    real_run = engine.run

    def recorded_run(*args, **kwargs):
        events.append("run")
        return real_run(*args, **kwargs)
    monkeypatch.setattr(engine, "run", recorded_run)
    y = f(x)
    events.append("returned")           # Execute returned before the program ran
    np.testing.assert_array_equal(np.asarray(y), np.ones(4))
    assert events == ["returned", "run"]


def test_asking_about_a_quick_result_runs_it_on_the_asking_thread(ipu, monkeypatch):
    f = jax.jit(lambda x: x * x)
    x = jax.device_put(np.arange(3, dtype=np.float32), ipu)
    f(x).block_until_ready()
    counts = runs_by_thread(monkeypatch, ipu)
    y = f(x)
    assert counts == {}
    y.block_until_ready()               # cheaper than waking the worker
    assert counts == {threading.current_thread().name: 1}
    np.testing.assert_array_equal(np.asarray(y), np.arange(3) ** 2)


def test_donated_state_through_many_quick_steps(ipu):
    step = jax.jit(lambda w, g: w - 0.5 * g, donate_argnums=0)
    w = jax.device_put(np.zeros(8, np.float32), ipu)
    g = jax.device_put(np.ones(8, np.float32), ipu)
    for _ in range(200):
        w = step(w, g)
    np.testing.assert_allclose(np.asarray(w), np.full(8, -100.0))


def test_quick_run_feeds_another_ipu(ipus):
    assert len(ipus) >= 2               # conftest models two
    f = jax.jit(lambda x: x * 3)
    g = jax.jit(lambda x: x + 1)                 # runs where its input lives: ipu1
    x = jax.device_put(np.arange(5, dtype=np.float32), ipus[0])
    f(x).block_until_ready()
    for _ in range(20):
        y = f(x)                                   # deferred on ipu0
        z = g(jax.device_put(y, ipus[1]))          # needed on ipu1 at once
        np.testing.assert_array_equal(np.asarray(z), np.arange(5) * 3 + 1)


def test_error_in_a_quick_run_reaches_the_sync_point(ipu, monkeypatch):
    engine = device_object(ipu).engine
    f = jax.jit(lambda x: x * 5)
    x = jax.device_put(np.ones(3, np.float32), ipu)
    f(x).block_until_ready()

    def failing(*args, **kwargs):
        raise RuntimeError("simulated exchange fault")
    monkeypatch.setattr(engine, "run", failing)
    y = f(x)
    z = f(x)     # runs y's program first, on this thread: the error stays with y
    with pytest.raises(Exception, match="simulated exchange fault"):
        np.asarray(y)
    with pytest.raises(Exception, match="simulated exchange fault"):
        z.block_until_ready()
    monkeypatch.undo()
    np.testing.assert_array_equal(np.asarray(f(x)), np.full(3, 5.0))


def test_the_callers_numpy_error_state_is_kept(ipu):
    f = jax.jit(lambda x: (1.0 / x, jnp.sqrt(x - 2)))
    x = jax.device_put(np.array([0.0, 1.0, 4.0], np.float32), ipu)
    f(x)[0].block_until_ready()
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # a numpy RuntimeWarning would raise
        for _ in range(5):
            inv, root = f(x)                        # run inline on this thread
        inv, root = np.asarray(inv), np.asarray(root)
    assert np.geterr() == before
    assert np.isinf(inv[0]) and inv[2] == 0.25
    assert np.isnan(root[0]) and root[2] == pytest.approx(np.sqrt(2.0))


def test_programs_with_host_callbacks_are_never_run_inline(ipu, monkeypatch):
    seen = []

    def f(x):
        jax.debug.callback(lambda v: seen.append(threading.current_thread().name), x)
        return x + 1
    g = jax.jit(f)
    x = jax.device_put(np.zeros(2, np.float32), ipu)
    for _ in range(5):
        x = g(x)
    x.block_until_ready()
    jax.effects_barrier()
    assert len(seen) == 5
    assert threading.current_thread().name not in seen   # always the device's worker
    np.testing.assert_array_equal(np.asarray(x), np.full(2, 5.0))


def test_ctrl_c_during_a_quick_run_on_the_users_thread_interrupts_the_user(ipu, monkeypatch, request):
    engine = device_object(ipu).engine
    f = jax.jit(lambda x: x - 1)
    x = jax.device_put(np.ones(4, np.float32), ipu)
    f(x).block_until_ready()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(engine, "run", interrupted)
    # The worker waits (a minute) for the user to run it: on a busy machine
    # it could otherwise take the run first, and the interrupt be its own.
    from jax_ipu.pjrt import device
    monkeypatch.setattr(device.DeviceWorker, "GRACE_SECONDS", 60.0)
    # Python's own Ctrl-C handler, as in a terminal: a process started with
    # SIGINT ignored (e.g. pytest run from `cmd &` in a script) never gets
    # the interrupt that the failed run re-raises.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    y = f(x)
    with pytest.raises(KeyboardInterrupt):
        try:
            np.asarray(y)        # runs y's program here: the copy fails naming the interrupt
        except jax.errors.JaxRuntimeError as error:
            assert "KeyboardInterrupt" in str(error)
        for _ in range(100000):  # and Ctrl-C is not swallowed: it lands at a bytecode boundary
            pass
    monkeypatch.undo()
    np.testing.assert_array_equal(np.asarray(f(x)), np.zeros(4))


def test_a_worker_asleep_until_a_later_deadline_wakes_for_an_earlier_one(ipu, monkeypatch):
    from jax_ipu.pjrt import device
    f = jax.jit(lambda x: x * 7)
    x = jax.device_put(np.ones(2, np.float32), ipu)
    f(x).block_until_ready()
    worker = device_object(ipu).worker
    monkeypatch.setattr(device.DeviceWorker, "GRACE_SECONDS", 60.0)
    y = f(x)                     # the worker now sleeps until this run's deadline, a minute away
    time.sleep(0.05)
    np.testing.assert_array_equal(np.asarray(y), np.full(2, 7.0))   # run here instead
    monkeypatch.setattr(device.DeviceWorker, "GRACE_SECONDS", 0.0005)
    z = f(x)
    deadline = time.monotonic() + 10
    while worker._jobs and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not worker._jobs, "the worker slept past the new run's deadline"
    np.testing.assert_array_equal(np.asarray(z), np.full(2, 7.0))


def test_a_worker_that_looked_at_a_job_another_thread_ran_gives_the_next_its_grace(monkeypatch):
    """The worker decides to run the job at the front once its grace is
    over, then waits for the device; if another thread ran that job
    meanwhile, the job now at the front still gets its own grace (it was
    run at once: a Ctrl-C test failed on a loaded machine)."""
    from jax_ipu.pjrt import device
    worker = device.DeviceWorker("ipu-test-worker")
    ran = []
    try:
        monkeypatch.setattr(device.DeviceWorker, "GRACE_SECONDS", 0.0)
        worker._run_lock.acquire()                   # as while another thread runs a job
        worker.submit(lambda: ran.append("first"), quick=True)    # due now: the worker waits for the lock
        time.sleep(0.1)
        worker._jobs.popleft()[0]()                  # another thread runs it, as help() does
        monkeypatch.setattr(device.DeviceWorker, "GRACE_SECONDS", 60.0)
        worker.submit(lambda: ran.append(threading.current_thread().name), quick=True)
        worker._run_lock.release()
        time.sleep(0.2)
        assert ran == ["first"]                      # the second waits out its grace...
        worker.help()
        assert ran == ["first", threading.current_thread().name]    # ... or the next thread that asks
    finally:
        if worker._run_lock.locked():
            worker._run_lock.release()
        worker.close()


def test_arguments_a_quick_program_was_not_compiled_for_are_clear_errors(ipus):
    # Below JAX's checks (the executable called directly, as the Model's
    # XLA:CPU chains do): the compiled dispatch hands them to the general
    # path, which names what is wrong; the program then runs as before.
    f = jax.jit(lambda x: x * 2 + 1)
    x = jax.device_put(np.arange(4, dtype=np.float32), ipus[0])
    executable = f.lower(x).compile()._executable.xla_executable
    wrong = {"expected float32\\[4\\], got float32\\[5\\]": [jax.device_put(np.zeros(5, np.float32), ipus[0])],
             "expected float32\\[4\\], got int32\\[4\\]": [jax.device_put(np.zeros(4, np.int32), ipus[0])],
             "is on IpuDevice\\(id=1.*not on IpuDevice\\(id=0": [jax.device_put(np.zeros(4, np.float32), ipus[1])],
             "takes 1 arguments, got 2": [x, x]}
    for message, args in wrong.items():
        with pytest.raises(jax.errors.JaxRuntimeError, match=message):
            executable.execute_sharded(args)
    [[y]] = executable.execute_sharded([x]).disassemble_into_single_device_arrays()
    np.testing.assert_array_equal(np.asarray(y), np.arange(4) * 2 + 1)


def test_a_quick_programs_executable_goes_with_its_last_handle(ipu, monkeypatch):
    # Without the cycle collector: what the compiled dispatch keeps of an
    # executable (and a sleeping worker of its last run) must not hold it,
    # nor its program, once JAX drops it.
    import gc
    import weakref

    from jax_ipu.pjrt._capi import drain_released

    from jax_ipu.pjrt import executable
    made = []
    real = executable.Executable.__init__

    def recorded(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(weakref.ref(self))
    monkeypatch.setattr(executable.Executable, "__init__", recorded)
    x = jax.device_put(np.arange(4, dtype=np.float32), ipu)
    gc.disable()
    try:
        f = jax.jit(lambda x: x * 3 - 7)
        for _ in range(5):
            y = f(x)
        np.testing.assert_array_equal(np.asarray(y), np.arange(4) * 3 - 7)
        assert len(made) == 1 and made[0]().dispatch_compiled
        del f, y
        jax.clear_caches()
        drain_released()          # (references the framework let go on its own threads)
        assert made[0]() is None
    finally:
        gc.enable()
