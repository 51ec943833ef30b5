"""The IPU Model executes a planned matmul as planned: one fp32 partial
product per K-chunk, combined in the fixed order ((p0 + p1) + p2) + ...

Within a chunk the rounding is the host BLAS's, which depends on the shape
of each call (OpenBLAS gives other bits for a row or column block than for
the whole), so the engine cuts a product by its shape alone: whether the
helper thread takes a half, or the partials are stacked or made chunk after
chunk, the values are the same bits."""
from __future__ import annotations

import concurrent.futures

import jax.numpy as jnp
import numpy as np
import pytest

from helpers import SMALL, compile_fn
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import blas, fusion, helper


def left_fold(parts: np.ndarray) -> np.ndarray:
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return total


SHAPES = [  # batch, m, k, n, chunks: stacked and chunk-by-chunk, one row block and two
    (1, 128, 784, 512, 16), (1, 128, 512, 10, 64), (1, 512, 128, 784, 4),
    (3, 40, 96, 72, 6), (1, 10, 128, 512, 1), (2, 300, 1024, 600, 8), (1, 33, 64, 7, 2),
]


@pytest.mark.parametrize("batch,m,k,n,chunks", SHAPES)
def test_partials_and_combine_follow_the_plan(batch, m, k, n, chunks):
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    size = k // chunks
    out = np.empty((chunks, batch, m, n), np.float32)
    blas.matmul_partials(a, b, out, chunks, size)
    for j in range(chunks):     # each partial is its chunk's product, in fp32
        exact = a[..., j * size:(j + 1) * size].astype(np.float64) @ b[..., j * size:(j + 1) * size, :]
        np.testing.assert_allclose(out[j], exact, rtol=1e-5, atol=1e-5 * np.sqrt(size))
    combined = blas.matmul_combined(a, b, chunks, size, np.float32, blas.CombineScratch())
    np.testing.assert_array_equal(combined, left_fold(out))
    np.testing.assert_allclose(combined, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("batch,m,k,n,chunks", SHAPES)
def test_values_do_not_depend_on_the_helper_or_the_stacking(monkeypatch, batch, m, k, n, chunks):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)

    def combined():
        return blas.matmul_combined(a, b, chunks, k // chunks, np.float32, blas.CombineScratch())
    results = []
    monkeypatch.setattr(helper, "spare_core", lambda ours=0: True)    # whatever the load
    results.append(combined())                      # the spinning helper
    helper.end_session()
    monkeypatch.setattr(helper, "spinner", lambda: None)
    with concurrent.futures.ThreadPoolExecutor(1, initializer=helper.init_helper_thread) as pool:
        for p in (pool, None):                      # a thread pool's helper, then none
            monkeypatch.setattr(helper, "helper_pool", lambda busy=False, p=p: p)
            results.append(combined())
    monkeypatch.setattr(blas, "STACKED_BYTES", 0)       # chunk after chunk, never stacked
    results.append(combined())
    monkeypatch.setattr(blas, "_sgemm", None)           # numpy's matmul and add, not cblas with beta = 1
    results.append(combined())
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_the_fixed_order_combine_is_a_left_fold():
    """np.add.reduce over the chunk axis adds the chunks one after the other
    (no pairwise summation), which the engine relies on."""
    rng = np.random.default_rng(3)
    parts = (rng.standard_normal((64, 5000)) * 10.0 ** rng.integers(-4, 5, (64, 1))).astype(np.float32)
    np.testing.assert_array_equal(np.add.reduce(parts, axis=0), left_fold(parts))


def test_engine_combines_scratch_partials_with_the_same_bits(monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    w = rng.standard_normal((512, 96)).astype(np.float32)
    program = compile_fn(lambda x, w: jnp.tanh(x @ w) @ w.T, x, w)
    matmuls = [s.compute_set.kernel for s in leaves(program.body) if isinstance(s, Execute)
               and isinstance(s.compute_set.kernel, codelets.MatMulPartials)]
    assert any(k.out.shape[0] > 1 for k in matmuls)      # the plan splits K
    assert {k.out.id for k in matmuls} & Engine(SMALL).load(program).stand_ins   # the partials are summed
    combined = Engine(SMALL).run(program, [x, w])
    monkeypatch.setattr(fusion, "stand_ins", lambda program: frozenset())
    materialised = Engine(SMALL).run(program, [x, w])
    np.testing.assert_array_equal(combined[0], materialised[0])
    np.testing.assert_allclose(combined[0], np.tanh(x.astype(np.float64) @ w) @ w.T, rtol=1e-4, atol=1e-3)


def test_a_half_the_helper_has_not_started_runs_on_the_caller(monkeypatch):
    import threading
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        release = threading.Event()
        pool.submit(release.wait)                    # the helper is busy elsewhere
        monkeypatch.setattr(helper, "spinner", lambda: None)
        monkeypatch.setattr(helper, "helper_pool", lambda busy=False: pool)
        ran_on = []
        helper.run_halves(lambda: ran_on.append(threading.current_thread()),
                        lambda: ran_on.append(threading.current_thread()))
        release.set()
    assert ran_on == [threading.current_thread()] * 2


@pytest.mark.skipif(helper._CORES < 2, reason="needs 2 cores")
def test_large_halves_go_to_the_pool_on_busy_cores(monkeypatch):
    """With no core free, small halves both run on the caller; large ones
    (a product of BUSY_SHARED_MACS or more, lanes) still hand the second
    to the pool's thread, as XLA:CPU's threads run whatever the load."""
    import threading
    monkeypatch.setattr(helper, "spinner", lambda: None)
    monkeypatch.setattr(helper, "spare_core", lambda: False)
    ran_on, second_ran = [], threading.Event()

    def first():
        ran_on.append(("first", threading.current_thread()))
        second_ran.wait(10)                     # give the pool's thread its start

    def second():
        ran_on.append(("second", threading.current_thread()))
        second_ran.set()
    helper.run_halves(lambda: ran_on.append(threading.current_thread()),
                      lambda: ran_on.append(threading.current_thread()))
    assert ran_on == [threading.current_thread()] * 2
    ran_on.clear()
    helper.run_halves(first, second, large=True)
    where = dict(ran_on)
    assert where["first"] is threading.current_thread() and where["second"] is not threading.current_thread()
    calls = []
    monkeypatch.setattr(helper, "run_halves", lambda a, b, large=False: calls.append(large) or (a(), b()))
    monkeypatch.setattr(blas, "run_halves", helper.run_halves)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 512, 512)).astype(np.float32), rng.standard_normal((1, 512, 512)).astype(np.float32)
    blas.matmul_combined(a, b, 2, 256, np.float32, blas.CombineScratch())          # 2^27 multiply-adds
    blas.matmul_combined(a[:, :, :64], b[:, :64], 1, 64, np.float32, blas.CombineScratch())
    assert calls == [True, False]


def spied(monkeypatch, name: str) -> list:
    """The arguments of every call of blas.<name> from now on."""
    calls, real = [], getattr(blas, name)

    def spy(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(blas, name, spy)
    return calls


def operands(rng, batch, m, k, n, a_t, b_t):
    """a [batch, m, k] and b [batch, k, n], each transposed in memory if asked."""
    a = (rng.standard_normal((batch, k, m)).astype(np.float32).transpose(0, 2, 1) if a_t
         else rng.standard_normal((batch, m, k)).astype(np.float32))
    b = (rng.standard_normal((batch, n, k)).astype(np.float32).transpose(0, 2, 1) if b_t
         else rng.standard_normal((batch, k, n)).astype(np.float32))
    return a, b


@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_cblas_chunks_read_transposed_operands_in_place(monkeypatch, a_t, b_t):
    """The planned sum made by cblas_sgemm with beta = 1 (one call per chunk,
    operands read through their strides) has the bits of the partials
    summed one after the other."""
    assert blas._sgemm is not None         # numpy's bundled OpenBLAS
    rng = np.random.default_rng(11)
    batch, m, k, n, chunks = 2, 96, 256, 80, 8
    a, b = operands(rng, batch, m, k, n, a_t, b_t)
    calls = spied(monkeypatch, "_sgemm")
    combined = blas.matmul_combined(a, b, chunks, k // chunks, np.float32, blas.CombineScratch())
    expected_flags = (blas._TRANS if a_t else blas._NO_TRANS, blas._TRANS if b_t else blas._NO_TRANS)
    assert calls and all((c[1].value, c[2].value) == expected_flags for c in calls)
    out = np.empty((chunks, batch, m, n), np.float32)
    blas.matmul_partials(a, b, out, chunks, k // chunks)
    np.testing.assert_array_equal(combined, left_fold(out))
    np.testing.assert_allclose(combined, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_cblas_is_not_given_broadcast_operands():
    a = np.broadcast_to(np.arange(64, dtype=np.float32), (1, 128, 64))     # zero row stride
    b = np.ones((1, 64, 512), np.float32)
    assert blas._gemm_layout(a[0], 128, 64) is None
    combined = blas.matmul_combined(a, b, 4, 16, np.float32, blas.CombineScratch())
    np.testing.assert_array_equal(combined, np.broadcast_to(a[0].sum(1, keepdims=True) * 1.0, (128, 512))[None])


@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (False, True), (True, True)])
def test_a_row_blocks_chunks_are_one_cblas_batch_call(monkeypatch, a_t, b_t):
    """Chunks of more than 100**3 multiply-adds: a row block's chunks (of
    every batch) are one cblas_sgemm_batch call, run in the plan's order on
    one OpenBLAS thread: the same bits as the partials summed one after the
    other, and as one cblas_sgemm call per chunk."""
    assert blas._sgemm_batch is not None       # numpy's bundled OpenBLAS (0.3.29+)
    rng = np.random.default_rng(12)
    batch, m, k, n, chunks = 2, 160, 512, 400, 8
    a, b = operands(rng, batch, m, k, n, a_t, b_t)
    calls = spied(monkeypatch, "_sgemm_batch")
    monkeypatch.setattr(helper, "spare_core", lambda ours=0: True)
    combined = blas.matmul_combined(a, b, chunks, k // chunks, np.float32, blas.CombineScratch())
    helper.end_session()
    assert len(calls) == 2                        # the two row halves
    out = np.empty((chunks, batch, m, n), np.float32)
    blas.matmul_partials(a, b, out, chunks, k // chunks)
    np.testing.assert_array_equal(combined, left_fold(out))
    monkeypatch.setattr(blas, "_sgemm_batch", None)          # a call per chunk
    np.testing.assert_array_equal(
        blas.matmul_combined(a, b, chunks, k // chunks, np.float32, blas.CombineScratch()), combined)
    np.testing.assert_allclose(combined, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_small_chunks_and_several_blas_threads_never_use_the_batch_call(monkeypatch):
    """OpenBLAS's batch call gives small products to kernels that crash in
    numpy's build, and with several OpenBLAS threads runs a batch's products
    at once (racing on their sum): neither reaches it."""
    calls = spied(monkeypatch, "_sgemm_batch")
    rng = np.random.default_rng(13)
    a = rng.standard_normal((1, 128, 512)).astype(np.float32)
    b = rng.standard_normal((1, 512, 10)).astype(np.float32)
    small = blas.matmul_combined(a, b, 64, 8, np.float32, blas.CombineScratch())   # 128x8x10 chunks
    np.testing.assert_allclose(small, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    a = rng.standard_normal((1, 128, 784)).astype(np.float32)
    b = rng.standard_normal((1, 784, 512)).astype(np.float32)
    out = np.empty((1, 128, 512), np.float32)
    # Outside _OneBlasThread (OpenBLAS's own thread count): a call per chunk.
    [call] = blas._sgemm_chunks(a, b, out, 16, 49, [(0, 128)]).values()
    call()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    assert calls == []


@pytest.mark.parametrize("batch,m,k,n,chunks", [(2, 96, 256, 80, 8), (1, 64, 256, 64, 2), (1, 160, 512, 400, 8)])
def test_a_products_prepared_calls_follow_new_operands_on_every_run(monkeypatch, batch, m, k, n, chunks):
    """The cblas calls of a product (one per chunk, or a batch call) are
    prepared once per layout and kept in its scratch: a later run with
    other arrays of that layout (new addresses, as every run has) computes
    on those, never on the first run's."""
    rng = np.random.default_rng(batch * m + n)
    scratch = blas.CombineScratch()
    calls = spied(monkeypatch, "_sgemm")
    for _ in range(3):
        a = rng.standard_normal((batch, m, k)).astype(np.float32)
        b = rng.standard_normal((batch, k, n)).astype(np.float32)
        combined = blas.matmul_combined(a, b, chunks, k // chunks, np.float32, scratch)
        out = np.empty((chunks, batch, m, n), np.float32)
        blas.matmul_partials(a, b, out, chunks, k // chunks)
        np.testing.assert_array_equal(combined, left_fold(out))
    assert "plan" in scratch.buffers
    if m * (k // chunks) * n <= blas.BATCH_MIN_MACS:
        assert len(calls) == 3 * batch * chunks       # one cblas_sgemm per chunk, each run
