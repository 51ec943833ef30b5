"""The engine's helper thread: when a second core is free, it takes half of
a large kernel (a planned matmul's row block, half of an element-wise
chain's chunks). The halves write disjoint outputs with the same code, so
the values never depend on whether the helper takes one.

Hand-offs. A helper that sleeps between halves (a thread pool's futex)
is slow to start each one on virtual machines (its idle core woken
through the hypervisor) and then runs on cold caches, and the caller
sleeps as long again waiting for it. So while a run shares work, the
helper waits for the next half spinning on a libc spinlock, outside the
GIL, as XLA:CPU's thread pool spins between its tasks: a hand-off then
costs several times less (model-speed.md has the figures). The spin lasts
from a run's first shared kernel (or, in a straight-line program, from
shortly before it: fast.straight_line.helper_schedule)
to the end of the run, to a long stretch without shared work, or to a host
call (a callback or feed may wait on the user for as long as it likes);
between runs the helper sleeps. A run takes the
spinning helper only when a core is free (as the kernel's run queue says),
and one run at a time: another device's run then shares through a thread
pool, or not at all.

Where libc has no pthread spinlocks (not Linux), the pool is used."""
from __future__ import annotations

import concurrent.futures
import ctypes
import os
import threading
import time
from collections.abc import Callable
from threading import get_ident

import numpy as np

_CORES = os.cpu_count() or 1


def init_helper_thread() -> None:
    """What every helper thread sets once: numpy ignores floating-point
    errors (the IPU does not trap, as on the device workers). (OpenBLAS's
    thread count is the engine's to set, around each product: see
    blas._OneBlasThread.)"""
    np.seterr(all="ignore")


_running = [0.0, 1]     # (when last looked, runnable threads then, our spinning helper aside)
_loadavg: list = []     # a descriptor of /proc/loadavg kept open (per process)


def runnable_threads() -> int:
    """Runnable threads on the host now (/proc/loadavg's fourth field), 1 if
    unknown. Read at offset 0 of a descriptor kept open, a tenth of the
    cost of opening, reading and closing it at the start of every other
    run."""
    try:
        if not _loadavg:
            _loadavg.append(os.open("/proc/loadavg", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        return int(os.pread(_loadavg[0], 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError, AttributeError):
        return 1


def spare_core() -> bool:
    """Whether another thread would get a core of its own now: the threads
    the kernel reports runnable (this one included; the spinning helper,
    which only waits for work, not) leave one free. A helper on busy cores
    only adds hand-offs (measured slower). Looked at every 10 ms."""
    now = time.monotonic()
    if now - _running[0] > 0.01:
        running = runnable_threads()
        spin = _spinner
        if spin is not None and spin.owner is not None:
            running -= 1
        _running[0], _running[1] = now, running
    return _running[1] < _CORES


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def helper_pool(busy: bool = False) -> concurrent.futures.ThreadPoolExecutor | None:
    """A one-thread pool for the helper's halves, or None when no second
    core is free (busy: even then)."""
    global _pool
    if _CORES < 2 or not (busy or spare_core()):
        return None
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="ipu-model-helper", initializer=init_helper_thread)
    return _pool


def _pool_halves(pool, first: Callable, second: Callable) -> None:
    """second() on the pool's thread while first() runs here; if the pool
    has not started second() by the time first() is done (its core went to
    another process), second() runs here instead of being waited for."""
    other = pool.submit(second)
    try:
        first()
    finally:
        stolen = other.cancel()
        if not stolen:
            other.result()
    if stolen:
        second()


def _spinlocks():
    """libc's pthread spinlock functions (lock, trylock, unlock, init), or
    None. ctypes calls them without the GIL."""
    try:
        libc = ctypes.CDLL(None)
        fns = [getattr(libc, f"pthread_spin_{name}") for name in ("lock", "trylock", "unlock", "init")]
    except (OSError, AttributeError):
        return None
    for fn in fns:
        fn.restype = ctypes.c_int
    for fn in fns[:3]:
        fn.argtypes = [ctypes.c_void_p]
    fns[3].argtypes = [ctypes.c_void_p, ctypes.c_int]
    return fns


_STOP = object()


class Spinner:
    """The spinning helper. Two spinlocks, both held between hand-offs: the
    caller releases `go` to hand over a half (the helper, spinning on it,
    takes it and runs the job) and then spins on `done` until the helper
    releases it. If the caller takes `go` back first (trylock), the helper
    never started the half and the caller runs it itself."""

    def __init__(self, lock, trylock, unlock, init):
        self._lock, self._trylock, self._unlock = lock, trylock, unlock
        # pthread_spinlock_t is an int; a long leaves room on any ABI.
        self._go_word, self._done_word = ctypes.c_long(0), ctypes.c_long(0)
        self._go, self._done = ctypes.byref(self._go_word), ctypes.byref(self._done_word)
        for word in (self._go, self._done):
            if init(word, 0) != 0 or lock(word) != 0:
                raise OSError("pthread spinlock unusable")
        self._job: object = None
        self._error: BaseException | None = None
        self.owner: int | None = None          # the thread whose run has the helper spinning
        self._claim = threading.Lock()         # one run at a time
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ipu-model-helper-spin", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        init_helper_thread()
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:
                self._lock(self._go)           # spins, outside the GIL, until a hand-off
                job = self._job
                if job is _STOP:
                    self._unlock(self._done)
                    break
                try:
                    job()
                except BaseException as exc:   # re-raised on the caller's thread
                    self._error = exc
                self._unlock(self._done)

    def begin(self) -> bool:
        """Whether the calling thread's run has the helper spinning (from
        now, if a core is free and no other run has it)."""
        me = get_ident()
        if self.owner == me:
            if spare_core():
                return True
            self.end()                         # another process wants the core
            return False
        if not self._thread.is_alive() or not spare_core() or not self._claim.acquire(blocking=False):
            return False
        self.owner = me
        self._wake.set()
        return True

    def end(self) -> None:
        """Stops the helper spinning, if the calling thread's run has it."""
        if self.owner != get_ident():
            return
        self._job = _STOP
        self._unlock(self._go)
        self._lock(self._done)                 # the helper has seen it
        self._job = None
        self.owner = None
        self._claim.release()

    def halves(self, first: Callable, second: Callable) -> None:
        self._job = second
        self._unlock(self._go)
        try:
            first()
        finally:
            stolen = self._trylock(self._go) == 0
            if not stolen:
                self._lock(self._done)
            self._job = None
        if stolen:
            second()
        error, self._error = self._error, None
        if error is not None:
            raise error


_spinner: Spinner | None = None
_spinner_lock = threading.Lock()
_SPINLOCKS = _spinlocks()


def spinner() -> Spinner | None:
    global _spinner
    if _SPINLOCKS is None or _CORES < 2:
        return None
    if _spinner is None:
        with _spinner_lock:
            if _spinner is None:
                try:
                    _spinner = Spinner(*_SPINLOCKS)
                except (OSError, RuntimeError):
                    return None
    return _spinner


def _forget_after_fork() -> None:
    """A forked child has no helper threads: it makes its own if it runs."""
    global _spinner, _pool, _pool_lock, _spinner_lock
    _spinner, _pool = None, None
    _pool_lock, _spinner_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


_local = threading.local()     # .shared: whether this thread's run handed a half to the spinner;
#                                .in_lane: this thread runs a lane


def run_halves(first: Callable, second: Callable, large: bool = False) -> None:
    """Calls first() here and second() on the helper when a core is free
    (else both here; always both here within a lane). `large`: halves of
    milliseconds each, which go to the pool's thread even when no core is
    free. On busy cores the operating system shares the time among
    threads, so a kernel kept on one thread got half the share of XLA:CPU's
    two (whose threads run whatever the load); a hand-off through the pool
    is small against such halves, and a half the pool has not
    started when the caller is done with its own runs on the caller."""
    if getattr(_local, "in_lane", False):
        first()
        second()
        return
    spin = spinner()
    if spin is not None and spin.begin():
        _local.shared = True
        spin.halves(first, second)
        return
    pool = helper_pool(busy=large)
    if pool is None:
        first()
        second()
        return
    _pool_halves(pool, first, second)


def _in_lane(fn: Callable) -> Callable:
    def lane():
        _local.in_lane = True
        try:
            fn()
        finally:
            _local.in_lane = False
    return lane


def run_lanes(first: Callable, second: Callable) -> None:
    """run_halves for two lanes of compute sets (model/fast/lanes.py, groups
    worth a hand-off): what runs in a lane shares nothing further with the
    helper."""
    run_halves(_in_lane(first), _in_lane(second), large=True)


def begin_session() -> None:
    """Work to share comes soon (a run that shared work last time starts,
    or a straight-line program's schedule says so): the helper starts
    spinning now, so that it is ready when the first half comes (waking it
    then made the caller do that half itself)."""
    spin = spinner()
    if spin is not None:
        spin.begin()


def end_session() -> bool:
    """The calling thread's run is over, or about to wait on the host: the
    helper stops spinning (a no-op when it is not spinning for this thread).
    Whether the run handed the spinner work since the last call."""
    spin = _spinner
    if spin is not None and spin.owner == get_ident():
        spin.end()
    shared = getattr(_local, "shared", False)
    _local.shared = False
    return shared
