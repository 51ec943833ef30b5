"""A thread dispatching small programs takes their runs itself (quick runs,
pjrt/device.py); the device's worker must then not wake up for each of
them: every wake-up takes the GIL from the dispatching thread. Counted, not
timed: the worker's wake-ups while a thread dispatches for a while."""
import queue
import time

import jax
import numpy as np
import pytest

from jax_ipu.pjrt import client, device

_SimpleQueue = queue.SimpleQueue


class _CountingQueue:
    """A worker's wake-up queue, counting the worker's waits on it."""

    def __init__(self):
        self.queue, self.gets = _SimpleQueue(), 0

    def put(self, item):
        self.queue.put(item)

    def get(self, *args, **kwargs):
        self.gets += 1
        return self.queue.get(*args, **kwargs)


@pytest.fixture()
def counted_worker(monkeypatch):
    made = []

    def counting():
        made.append(_CountingQueue())
        return made[-1]
    with monkeypatch.context() as m:
        m.setattr(device.queue, "SimpleQueue", counting)
        worker = device.DeviceWorker("counted")
    yield worker, made[0]
    worker.close()


@pytest.mark.parametrize("synced", [False, True])
def test_a_thread_dispatching_quick_jobs_wakes_the_worker_rarely(counted_worker, synced):
    worker, wakes = counted_worker
    ran = []
    time.sleep(0.01)
    before = wakes.gets
    seconds = 0.1
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        worker.submit(lambda: ran.append(1), True)
        if synced:
            worker.wanted()                 # the caller waits for each result
        time.sleep(20e-6)                   # the rest of a call, the GIL let go (as JAX's dispatch does)
        if not synced:
            worker.help()                   # the next call runs the last one
    waits = wakes.gets - before
    # Before: one wait per grace (0.5 ms) back to back, about 200 here, and
    # one per job when each was waited for (750); now one per linger (8 ms,
    # so 13 here) while others take the jobs.
    assert waits <= 50, (waits, len(ran))
    assert len(ran) > 100


def test_a_quick_job_nobody_asks_for_runs_within_a_linger_of_its_grace(counted_worker):
    worker, _ = counted_worker
    for _ in range(50):                      # others took the jobs: the worker lingers
        worker.submit(lambda: None, True)
        worker.wanted()
    done = []
    submitted = time.perf_counter()
    worker.submit(lambda: done.append(time.perf_counter()), True)    # nobody asks for this one
    deadline = submitted + 10
    while not done and time.perf_counter() < deadline:
        time.sleep(0.001)
    assert done


@pytest.mark.parametrize("synced", [False, True])
def test_back_to_back_and_synced_small_programs_give_their_values(ipu, synced):
    f = jax.jit(lambda x: x * 2 + 1)
    x = jax.device_put(np.arange(4, dtype=np.float32), ipu)
    y = x
    for _ in range(200):
        y = f(y)
        if synced:
            y.block_until_ready()
    expected = np.arange(4, dtype=np.float32)
    for _ in range(200):
        expected = expected * 2 + 1
    np.testing.assert_array_equal(np.asarray(y), expected)
    assert not client.CURRENT.device(ipu.id).worker._jobs or not synced
