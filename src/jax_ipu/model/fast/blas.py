"""The engine's planned matmuls on the host's BLAS: every K-chunk's partial
product is its own BLAS call on one thread, and the partials are combined
in the plan's fixed order, so the values never depend on threads or load.

OpenBLAS spreads even small products over every core, and when the cores
are busy its threads wait on one another, a hundred times as long as the
product itself on shared cores. Planned products therefore run with
OpenBLAS on one thread (its thread count is process-wide in numpy's build:
see _OneBlasThread); the engine uses a second core its own way: a helper
thread (model/fast/helper.py) takes half of the rows of a large product."""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import threading

import numpy as np

from jax_ipu.model.fast.helper import run_halves
from jax_ipu.model.fast.xla_chains import aligned_empty


def _openblas() -> ctypes.CDLL | None:
    """numpy's bundled OpenBLAS, or None when numpy uses another BLAS."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libs, "*openblas*")):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


_lib = _openblas()


def _set_local_threads():
    """openblas_set_num_threads_local (0.3.27+), which sets OpenBLAS's
    thread count (for every thread, in numpy's build: see _OneBlasThread)
    and returns the previous one; None without it."""
    fn = getattr(_lib, "openblas_set_num_threads_local", None) if _lib is not None else None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def _cblas(name: str):
    """The cblas function `name` with 64-bit integers (numpy's OpenBLAS is
    built with them and prefixes its names), as a function object of its
    own (no argtypes: see _sgemm_chunks), or None."""
    for symbol in (f"scipy_cblas_{name}64_", f"cblas_{name}64_"):
        if _lib is not None and hasattr(_lib, symbol):
            fn = _lib[symbol]
            fn.restype = None
            return fn
    return None


set_local_threads = _set_local_threads()
# cblas_sgemm adds a K-chunk's product onto the running sum in one call
# (beta = 1), see _sgemm_chunks, which calls it with ctypes objects made once
# per row block and updated in place (no argtypes): converting 14 Python
# numbers on every call held the GIL twice as long, and the helper thread's
# calls wait for it.
_sgemm = _cblas("sgemm")
# OpenBLAS's cblas_sgemm_batch (0.3.29+): a list of products in one call, run
# one after the other, in order, when OpenBLAS has one thread (see
# _OneBlasThread). A row block's chunks then run in one call without the
# GIL, not one Python-level call each (whose GIL hand-offs, with the helper
# thread taking the other half, cost more than the calls).
_sgemm_batch = _cblas("sgemm_batch")
# cblas_saxpy: y += alpha * x, a fused multiply-add per element (see axpy).
_saxpy = _cblas("saxpy")


# A planned matmul of at least this many multiply-adds (all chunks) is cut
# into two row halves, whatever the load, so that its values never depend on
# whether the helper thread takes one: each half runs every K-chunk of its
# rows as its own BLAS calls, and the planned combine, on one thread.
SHARED_MACS = 1 << 22
# Below this many bytes a row block's partials of every chunk are made by
# one stacked np.matmul (one BLAS call per chunk, without a Python call
# each) and summed in place; above, chunk after chunk into a running sum.
STACKED_BYTES = 1 << 20

def row_blocks(batch: int, m: int, k: int, n: int, whole: bool = False) -> list[tuple[int, int]]:
    """The rows each piece of work computes: halves (cut at a multiple of 8)
    for large products, else all rows. Decided by the shape alone, and by
    `whole` (the product runs in a lane, model/fast/lanes.py), never by load."""
    if not whole and m >= 32 and batch * m * k * n >= SHARED_MACS:
        half = (m // 2 + 7) // 8 * 8
        return [(0, half), (half, m)]
    return [(0, m)]


def _stacked(x: np.ndarray, chunks: int, size: int, axis: int) -> np.ndarray:
    """x [batch, r, K] (axis -1) or [batch, K, c] (axis -2) as a view
    [chunks, batch, r, size] or [chunks, batch, size, c]: chunk j first."""
    if axis == -1:
        return x.reshape(*x.shape[:-1], chunks, size).transpose(2, 0, 1, 3)
    return x.reshape(x.shape[0], chunks, size, x.shape[-1]).transpose(1, 0, 2, 3)


# A product of at least this many multiply-adds (a millisecond or more on
# one core) has its halves shared even on busy cores (helper.run_halves).
BUSY_SHARED_MACS = 1 << 26


def _run(rows, blocks, macs: int = 0) -> None:
    if len(blocks) == 1:
        rows(*blocks[0])
    else:
        run_halves(lambda: rows(*blocks[0]), lambda: rows(*blocks[1]), large=macs >= BUSY_SHARED_MACS)


_blas_lock = threading.Lock()
_blas_users = 0             # threads inside _OneBlasThread now
_blas_saved: int | None = None


class _OneBlasThread:
    """OpenBLAS on the calling thread alone within the block.

    numpy's OpenBLAS (0.3.31) applies openblas_set_num_threads_local to
    every thread, not only the caller: restoring the user's count when one
    thread leaves the block gave the other engine thread, still inside
    its own, two OpenBLAS threads mid-product (other bits: a lane's product
    came out 1 ulp off in the process's first run). So the count is set to
    1 by whoever enters and given back only when the last thread leaves."""

    def __enter__(self):
        global _blas_users, _blas_saved
        if set_local_threads is None:
            return
        with _blas_lock:
            previous = set_local_threads(1)
            if _blas_users == 0:
                _blas_saved = previous
            _blas_users += 1

    def __exit__(self, *exc):
        global _blas_users, _blas_saved
        if set_local_threads is None:
            return
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0 and _blas_saved is not None:
                set_local_threads(_blas_saved)
                _blas_saved = None


def has_axpy() -> bool:
    """Whether axpy can run: numpy's OpenBLAS with cblas_saxpy and a
    per-thread thread count (OpenBLAS 0.3.27 or later)."""
    return _saxpy is not None and set_local_threads is not None


def axpy(alpha: float, x: np.ndarray, y: np.ndarray) -> bool:
    """y += alpha * x over flat, C-ordered float32 arrays of one size, in
    BLAS calls on this thread, each element rounded once: a fused
    multiply-add, as XLA:CPU contracts a multiply feeding an add (an SGD
    update w - lr * g gives XLA's bits; two numpy passes round twice and
    differ in a few elements in a hundred). One pass over memory without
    the GIL, against numpy's two with a temporary (see model-speed.md).
    False (nothing done) without numpy's OpenBLAS.

    OpenBLAS's kernel takes whole blocks of AXPY_BLOCK elements and rounds
    the rest twice in a plain loop (measured: element 32 of 33 differed
    from XLA's): the rest goes through the kernel as a zero-padded block.

    BLAS returns at once when alpha is zero, which would drop x's NaNs and
    infinities (0 * inf is NaN) and the sign of y's zeros: numpy does that
    case (0 * x is exact, so it is still rounded once)."""
    if not has_axpy():
        return False
    if alpha == 0.0:
        np.add(y, np.multiply(x, np.float32(alpha)), out=y)
        return True
    def saxpy(count: int, xs: np.ndarray, ys: np.ndarray) -> None:
        _saxpy(ctypes.c_int64(count), ctypes.c_float(alpha), ctypes.c_void_p(xs.ctypes.data), ctypes.c_int64(1),
               ctypes.c_void_p(ys.ctypes.data), ctypes.c_int64(1))
    n = x.size
    head = n - n % AXPY_BLOCK
    with _OneBlasThread():
        if head:
            saxpy(head, x, y)
        if head < n:
            pad = np.zeros((2, AXPY_BLOCK), np.float32)
            pad[0, :n - head], pad[1, :n - head] = x[head:], y[head:]
            saxpy(AXPY_BLOCK, pad[0], pad[1])
            y[head:] = pad[1, :n - head]
    return True


# The elements OpenBLAS's x86-64 saxpy kernel takes at a time (n & -32 in
# kernel/x86_64/saxpy.c; its own loop does the rest).
AXPY_BLOCK = 32


def matmul_partials(a: np.ndarray, b: np.ndarray, out: np.ndarray, chunks: int, size: int,
                    whole: bool = False) -> None:
    """out[j] = a[..., j-th K-chunk] @ b[..., j-th K-chunk, :]: the planned
    partial products, one BLAS call per chunk (and row block)."""
    batch, m, k = a.shape
    n = b.shape[-1]
    sb = _stacked(b, chunks, size, -2)

    def rows(r0, r1):
        np.matmul(_stacked(a[:, r0:r1], chunks, size, -1), sb, out=out[:, :, r0:r1])
    with _OneBlasThread():
        _run(rows, row_blocks(batch, m, k, n, whole), batch * m * k * n)


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


# cblas constants.
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
# A chunk's product of at least this many multiply-adds goes to cblas_sgemm
# through ctypes (a call costs about twice np.matmul's, which the larger
# products repay).
SGEMM_MACS = 1 << 16
# OpenBLAS's batch call gives products of at most this many multiply-adds
# to its small-matrix kernels (the single call does not on this CPU: other
# bits), and those crash in numpy's OpenBLAS 0.3.31 (measured: 128x8x10):
# smaller chunks are single calls.
BATCH_MIN_MACS = 100 ** 3


def _gemm_layout(x: np.ndarray, rows: int, cols: int) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of x's last two axes, a
    rows x cols float32 matrix, as row-major cblas reads it; None when its
    strides are no such layout (broadcast, negative or odd steps)."""
    s_row, s_col = x.strides[-2], x.strides[-1]
    item = x.itemsize
    if s_col == item and s_row % item == 0 and s_row // item >= max(cols, 1):
        return _NO_TRANS, s_row // item
    if s_row == item and s_col % item == 0 and s_col // item >= max(rows, 1):
        return _TRANS, s_col // item
    return None


def _sgemm_chunks(a: np.ndarray, b: np.ndarray, out: np.ndarray, chunks: int, size: int,
                  blocks: list, scratch: CombineScratch | None = None) -> dict:
    """For each row block (r0, r1), a call() computing out[:, r0:r1] = the
    chunks' products of those rows summed in the plan's order,
    ((p0 + p1) + p2) + ...: one cblas_sgemm per batch and chunk, the first
    with beta = 0, the next adding onto the sum (beta = 1), all of them in
    one cblas_sgemm_batch call where it can take them; None for a block
    whose operands are not float32 matrices cblas can read in place, or
    whose chunks are too small to pay for the calls. OpenBLAS computes a
    chunk's product in registers and adds it to the stored sum once, so
    the bits are those of the partial products summed one after the other
    (tests/ipu/model/test_matmul_plan_order.py). Keyed by r0.

    Everything but the BLAS calls is done here, for every block before any
    runs, and cheaply: what depends only on the operands' layout is kept in
    `scratch` (the product's) from run to run, and a run reads the three
    addresses and adds them to each block's offsets. The helper thread
    taking a block then needs the GIL only to start its call (else it
    waits for the GIL while the caller does this part for its own block,
    then does it for its own)."""
    key = (a.dtype, b.dtype, out.dtype, a.shape, a.strides, b.shape, b.strides, out.strides,
           out.flags.c_contiguous, chunks, size, tuple(blocks), _blas_users > 0)
    plan = scratch.buffers.get("plan") if scratch is not None else None
    if plan is None or plan[0] != key:
        plan = (key, _block_plans(a, b, out, chunks, size, blocks))
        if scratch is not None:
            scratch.buffers["plan"] = plan
    calls = {}
    bases = None
    for r0, block in plan[1]:
        if block is None:
            calls[r0] = None
            continue
        if bases is None:
            bases = np.array([[a.ctypes.data], [b.ctypes.data], [out.ctypes.data]], np.int64)
        offsets, pointers, lists, make = block
        np.add(offsets, bases, out=pointers)
        calls[r0] = make(lists, pointers, (a, b, out))
    return calls


def _block_plans(a, b, out, chunks, size, blocks) -> list:
    """[(r0, plan or None)]: for a row block cblas can take, (byte offsets of
    each call's a, b and c from the operands' own addresses [3, calls],
    the array their sums go to, ctypes pointers to its rows, make(lists,
    addresses, operands) -> call())."""
    plans = [(r0, None) for r0, _ in blocks]
    if _sgemm is None or set_local_threads is None or a.dtype != np.float32 or b.dtype != np.float32:
        return plans
    if not out.flags.c_contiguous or out.dtype != np.float32:
        return plans
    batch, n = a.shape[0], b.shape[-1]
    la, lb = _gemm_layout(a, a.shape[1], a.shape[2]), _gemm_layout(b, b.shape[1], b.shape[2])
    if la is None or lb is None or a.strides[0] < 0 or b.strides[0] < 0:
        return plans
    (ta, lda), (tb, ldb) = la, lb
    # Step from one chunk's first column (row) of a (b) to the next.
    a_chunk = size * a.strides[2]
    b_chunk = size * b.strides[1]
    for i, (r0, r1) in enumerate(blocks):
        rows = r1 - r0
        if rows * size * n < SGEMM_MACS:
            continue
        start = np.array([[r0 * a.strides[1]], [0], [r0 * out.strides[1]]], np.int64)
        gemm = (ta, lda, tb, ldb, rows, n, size)
        if _sgemm_batch is not None and rows * size * n > BATCH_MIN_MACS and _blas_users > 0:
            # (With more than one OpenBLAS thread the batch's products would
            # run at once, racing on their sum: only inside _OneBlasThread.)
            offsets, call = _batch_layout(a.strides, b.strides, out.strides, batch, chunks, a_chunk, b_chunk, gemm)

            def make(lists, addresses, operands, call=call):
                return functools.partial(call, *lists, addresses)
        else:
            offsets = np.zeros((3, 1), np.int64)
            each = _each_chunk((batch, a.strides[0], b.strides[0], out.strides[0]), chunks, a_chunk, b_chunk, gemm)

            def make(lists, addresses, operands, each=each):
                a0, b0, c0 = (int(x) for x in addresses[:, 0])
                return functools.partial(each, a0, b0, c0, operands)
        offsets = np.ascontiguousarray(offsets + start)
        pointers = np.empty_like(offsets)
        plans[i] = (r0, (offsets, pointers, [ctypes.c_void_p(p.ctypes.data) for p in pointers], make))
    return plans


def _each_chunk(steps, chunks, a_chunk, b_chunk, gemm):
    """each(a0, b0, c0, operands) making one cblas_sgemm per batch and chunk
    of a row block, its operands' first elements at those addresses (the
    operands: the arrays, kept alive by the caller). Its ctypes arguments
    are made once, with the plan, and updated in place on each call."""
    ta, lda, tb, ldb, rows, n, size = gemm
    i64 = ctypes.c_int64
    pa, pb, pc, beta = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_float()
    args = (ctypes.c_int(_ROW_MAJOR), ctypes.c_int(ta), ctypes.c_int(tb), i64(rows), i64(n), i64(size),
            ctypes.c_float(1.0), pa, i64(lda), pb, i64(ldb), beta, pc, i64(n))
    batch, a_batch, b_batch, c_batch = steps

    def each(a0, b0, c0, operands):
        for i in range(batch):
            ap, bp = a0 + i * a_batch, b0 + i * b_batch
            pc.value = c0 + i * c_batch
            for j in range(chunks):
                pa.value, pb.value, beta.value = ap + j * a_chunk, bp + j * b_chunk, 0.0 if j == 0 else 1.0
                _sgemm(*args)
    return each


@functools.lru_cache(maxsize=256)
def _batch_layout(a_strides, b_strides, c_strides, batch, chunks, a_chunk, b_chunk, gemm):
    """For one cblas_sgemm_batch call over a row block: the byte offsets
    of each product's a, b and c [3, batch * chunks], and call(a list,
    b list, c list) making it with the other arguments (gemm: ta, lda, tb,
    ldb, rows, n, size). Two groups run in order: every batch's first chunk
    with beta = 0, then the other chunks, batch after batch and in the
    plan's order, each added onto its sum (beta = 1)."""
    ta, lda, tb, ldb, rows, n, size = gemm
    batch_of, chunk_of = np.divmod(np.arange(batch * chunks, dtype=np.int64), chunks)
    order = np.argsort(chunk_of != 0, kind="stable")
    offsets = np.ascontiguousarray(np.stack([batch_of * a_strides[0] + chunk_of * a_chunk,
                                             batch_of * b_strides[0] + chunk_of * b_chunk,
                                             batch_of * c_strides[0]])[:, order])
    kept = []              # the arrays behind the pointers, alive as long as `call`

    def per_group(values, dtype=np.int64) -> ctypes.c_void_p:
        x = np.array(np.broadcast_to(values, 2), dtype)
        kept.append(x)
        return ctypes.c_void_p(x.ctypes.data)
    head = (ctypes.c_int(_ROW_MAJOR), per_group(ta, np.int32), per_group(tb, np.int32), per_group(rows),
            per_group(n), per_group(size), per_group(1.0, np.float32))
    a_ld, b_ld, c_ld = per_group(lda), per_group(ldb), per_group(n)
    betas = per_group([0.0, 1.0], np.float32)
    groups, sizes = ctypes.c_int64(1 if chunks == 1 else 2), per_group([batch, batch * (chunks - 1)])

    def call(a_list, b_list, c_list, pointers=None):
        """(pointers: the array behind the lists, kept alive by the caller's partial.)"""
        _sgemm_batch(*head, a_list, a_ld, b_list, b_ld, betas, c_list, c_ld, groups, sizes)
    call.kept = kept
    return offsets, call


def matmul_combined(a: np.ndarray, b: np.ndarray, chunks: int, size: int, dtype,
                    scratch: CombineScratch, whole: bool = False) -> np.ndarray:
    """The partials of matmul_partials combined as the plan says, in their
    fixed order ((p0 + p1) + p2) + ..., in `dtype`: [batch, m, n]. Only a
    row block's partials exist at a time, in cache, never the whole set."""
    batch, m, k = a.shape
    n = b.shape[-1]
    out = aligned_empty((batch, m, n), dtype)      # read in place by an XLA:CPU convert to float16

    def rows(r0, r1):
        call = calls[r0]
        if call is not None:
            call()
            return
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
    blocks = row_blocks(batch, m, k, n, whole)
    with _OneBlasThread():
        calls = _sgemm_chunks(a, b, out, chunks, size, blocks, scratch)
        _run(rows, blocks, batch * m * k * n)
    return out
