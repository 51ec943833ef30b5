"""How many threads numpy's OpenBLAS uses for the engine's partial products.

A planned matmul is many small blocks (one per K-chunk). OpenBLAS spreads
even small products over every core, and when the cores are busy its
threads wait on one another: on 2 shared cores a 128x49x512 block took
15 ms instead of 0.15 ms. Small blocks therefore run on the calling thread
alone, set with OpenBLAS's per-thread switch so nothing else is affected."""
from __future__ import annotations

import concurrent.futures
import ctypes
import glob
import os
import threading
import time

import numpy as np

# Below this many multiply-adds a block runs on the calling thread. Blocks
# of a planned matmul are at most tens of millions of multiply-adds; on 2
# busy cores a 128x784x512 product took 31 ms threaded, 3.8 ms on one thread.
SINGLE_THREAD_MACS = 1 << 28


def _thread_switch():
    """OpenBLAS's openblas_set_num_threads_local (0.3.27+) in numpy's
    bundled library, or None when numpy uses another BLAS."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas*")):
        try:
            switch = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        switch.argtypes, switch.restype = [ctypes.c_int], ctypes.c_int
        return switch
    return None


_switch = _thread_switch()


# A planned matmul of at least this many multiply-adds (all chunks) shares
# its single-threaded chunks with a helper thread: each chunk is still one
# BLAS call of its own, so the partials are the same bits either way.
SHARED_MACS = 1 << 22

_helper: concurrent.futures.ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()


def _init_helper() -> None:
    np.seterr(all="ignore")    # as on the device workers: the IPU does not trap
    if _switch is not None:
        _switch(1)


_CORES = os.cpu_count() or 1
_spare = [0.0, False]     # (when last looked, whether a core was free)


def _spare_core() -> bool:
    """Whether another thread would get a core of its own now: the threads
    the kernel reports runnable (this one included) leave one free. A
    helper on busy cores only adds hand-offs (measured 5% slower)."""
    now = time.monotonic()
    if now - _spare[0] > 0.01:
        try:
            with open("/proc/loadavg", "rb") as f:
                running = int(f.read().split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            running = 1
        _spare[0], _spare[1] = now, running < _CORES
    return _spare[1]


def helper_pool() -> concurrent.futures.ThreadPoolExecutor | None:
    """One thread that takes half of a large kernel's independent pieces
    (matmul K-chunks, element-wise chain chunks), or None when no second
    core is free."""
    global _helper
    if _CORES < 2 or not _spare_core():
        return None
    if _helper is None:
        with _helper_lock:
            if _helper is None:
                _helper = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="ipu-model-helper", initializer=_init_helper)
    return _helper


def _blocks(a, b, out, lo: int, hi: int, size: int) -> None:
    for j in range(lo, hi):
        np.matmul(a[..., j * size:(j + 1) * size], b[..., j * size:(j + 1) * size, :], out=out[j])


def matmul_blocks(a: np.ndarray, b: np.ndarray, out: np.ndarray, chunks: int, size: int) -> None:
    """out[j] = a[..., j-th K-chunk] @ b[..., j-th K-chunk, :], one BLAS call per chunk."""
    block_macs = a.shape[-2] * size * b.shape[-1] * int(np.prod(a.shape[:-2], dtype=np.int64))
    small = block_macs < SINGLE_THREAD_MACS
    previous = _switch(1) if small and _switch is not None else None
    try:
        pool = helper_pool() if small and _switch is not None and chunks > 1 and block_macs * chunks >= SHARED_MACS else None
        if pool is None:
            _blocks(a, b, out, 0, chunks, size)
        else:   # the helper takes the second half of the chunks
            half = chunks // 2
            other = pool.submit(_blocks, a, b, out, half, chunks, size)
            try:
                _blocks(a, b, out, 0, half, size)
            finally:
                other.result()
    finally:
        if previous is not None:
            _switch(previous)
