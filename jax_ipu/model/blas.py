"""The engine's planned matmuls on the host's BLAS: every K-chunk's partial
product is its own BLAS call on one thread, and the partials are combined
in the plan's fixed order, so the values never depend on threads or load.

OpenBLAS spreads even small products over every core, and when the cores
are busy its threads wait on one another: on 2 shared cores a 128x49x512
block took 15 ms instead of 0.15 ms. Planned products therefore run with
OpenBLAS on the calling thread alone (its per-thread switch, so nothing
else is affected); the engine uses a second core its own way: a helper
thread takes half of the rows of a large product, or of a large chain."""
from __future__ import annotations

import concurrent.futures
import ctypes
import glob
import os
import threading
import time

import numpy as np

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


# A planned matmul of at least this many multiply-adds (all chunks) is cut
# into two row halves, whatever the load, so that its values never depend on
# whether the helper thread takes one: each half runs every K-chunk of its
# rows as its own BLAS calls, and the planned combine, on one thread.
SHARED_MACS = 1 << 22
# Below this many bytes a row block's partials of every chunk are made by
# one stacked np.matmul (one BLAS call per chunk, without a Python call
# each) and summed in place; above, chunk after chunk into a running sum.
STACKED_BYTES = 1 << 20

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


def _row_blocks(batch: int, m: int, k: int, n: int) -> list[tuple[int, int]]:
    """The rows each piece of work computes: halves (cut at a multiple of 8)
    for large products, else all rows. Decided by the shape alone."""
    if m >= 32 and batch * m * k * n >= SHARED_MACS:
        half = (m // 2 + 7) // 8 * 8
        return [(0, half), (half, m)]
    return [(0, m)]


def _stacked(x: np.ndarray, chunks: int, size: int, axis: int) -> np.ndarray:
    """x [batch, r, K] (axis -1) or [batch, K, c] (axis -2) as a view
    [chunks, batch, r, size] or [chunks, batch, size, c]: chunk j first."""
    if axis == -1:
        return x.reshape(*x.shape[:-1], chunks, size).transpose(2, 0, 1, 3)
    return x.reshape(x.shape[0], chunks, size, x.shape[-1]).transpose(1, 0, 2, 3)


def run_halves(first, second) -> None:
    """Calls first() here and second() on the helper thread when a core is
    free. If the helper has not started second() by the time first() is
    done (its core went to another process), second() runs here instead of
    being waited for. The halves write disjoint outputs: the same values
    whoever runs them."""
    pool = helper_pool()
    if pool is None:
        first()
        second()
        return
    other = pool.submit(second)
    try:
        first()
    finally:
        stolen = other.cancel()
        if not stolen:
            other.result()
    if stolen:
        second()


def _run(rows, blocks) -> None:
    if len(blocks) == 1:
        rows(*blocks[0])
    else:
        run_halves(lambda: rows(*blocks[0]), lambda: rows(*blocks[1]))


class _OneBlasThread:
    """OpenBLAS on the calling thread alone within the block."""

    def __enter__(self):
        self.previous = _switch(1) if _switch is not None else None

    def __exit__(self, *exc):
        if self.previous is not None:
            _switch(self.previous)


def matmul_partials(a: np.ndarray, b: np.ndarray, out: np.ndarray, chunks: int, size: int) -> None:
    """out[j] = a[..., j-th K-chunk] @ b[..., j-th K-chunk, :]: the planned
    partial products, one BLAS call per chunk (and row block)."""
    batch, m, k = a.shape
    n = b.shape[-1]
    sb = _stacked(b, chunks, size, -2)

    def rows(r0, r1):
        np.matmul(_stacked(a[:, r0:r1], chunks, size, -1), sb, out=out[:, :, r0:r1])
    with _OneBlasThread():
        _run(rows, _row_blocks(batch, m, k, n))


class CombineScratch:
    """Buffers one combined matmul keeps across runs: per row block, the
    partials of a chunk (or of every chunk, stacked)."""

    def __init__(self):
        self.buffers: dict = {}

    def get(self, key, shape, dtype) -> np.ndarray:
        buf = self.buffers.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self.buffers[key] = np.empty(shape, dtype)
        return buf


def matmul_combined(a: np.ndarray, b: np.ndarray, chunks: int, size: int, dtype,
                    scratch: CombineScratch) -> np.ndarray:
    """The partials of matmul_partials combined as the plan says, in their
    fixed order ((p0 + p1) + p2) + ..., in `dtype`: [batch, m, n]. Only a
    row block's partials exist at a time, in cache, never the whole set."""
    batch, m, k = a.shape
    n = b.shape[-1]
    out = np.empty((batch, m, n), dtype)

    def rows(r0, r1):
        acc = out[:, r0:r1]
        ar = a[:, r0:r1]
        if chunks * acc.size * out.itemsize <= STACKED_BYTES:
            parts = scratch.get(r0, (chunks, batch, r1 - r0, n), dtype)
            np.matmul(_stacked(ar, chunks, size, -1), _stacked(b, chunks, size, -2), out=parts)
            np.add.reduce(parts, axis=0, out=acc)
            return
        np.matmul(ar[..., :size], b[..., :size, :], out=acc)
        part = scratch.get(r0, acc.shape, dtype)
        for j in range(1, chunks):
            np.matmul(ar[..., j * size:(j + 1) * size], b[..., j * size:(j + 1) * size, :], out=part)
            np.add(acc, part, out=acc)
    with _OneBlasThread():
        _run(rows, _row_blocks(batch, m, k, n))
    return out
