"""Layout ops, dot_general and reduce on the IPU Model against JAX's CPU
backend, and the partitioned forms the planners choose."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn, run_ipu, values
from jax_ipu.compiler.planners.matmul import plan_matmul
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Copy, Execute, leaves
from jax_ipu.targets import get_target


def rand(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_layout_ops(dtype):
    x = values(dtype, (4, 6, 5))

    def f(a):
        return (a.reshape(6, 20), jnp.transpose(a, (2, 0, 1)), a[1:3, ::2, 1:],
                jnp.concatenate([a, a[:, :2]], axis=1), jnp.broadcast_to(a[:, :1, :], (4, 3, 5)),
                jnp.broadcast_to(a[0, 0, 0], (2, 3)), lax.broadcast_in_dim(a[0], (5, 6, 2, 5), (1, 3)))
    assert_matches_cpu(f, x, target=SMALL)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int16], ids=lambda d: np.dtype(d).name)
def test_constants_and_iota(dtype):
    def f(a):
        return (a + jnp.arange(7, dtype=dtype), a * jnp.array([1, 2, 3, 4, 5, 6, 7], dtype),
                lax.broadcasted_iota(dtype, (3, 4), 1), jnp.full((2, 2), 3, dtype), jnp.zeros((0, 3), dtype))
    assert_matches_cpu(f, values(dtype, (7,)), target=SMALL)


def test_transpose_is_a_copy_with_exchange_cost():
    program = compile_fn(lambda a: a.T + 1, rand((64, 48)))
    copies = [s for s in leaves(program.body) if isinstance(s, Copy)]
    assert len(copies) == 1 and copies[0].exchange_bytes > 0 and copies[0].cycles > SMALL.sync_cycles


DOTS = {
    "matvec": ((33,), (33, 5), lambda a, b: a @ b),
    "matmul": ((17, 40), (40, 9), lambda a, b: a @ b),
    "batched": ((3, 8, 12), (3, 12, 5), lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b)),
    "contract-first": ((12, 7), (12, 4), lambda a, b: jnp.einsum("km,kn->mn", a, b)),
    "two-contracting": ((6, 4, 5), (5, 4, 3), lambda a, b: jnp.einsum("mkl,lkn->mn", a, b)),
    "batch-last": ((8, 6, 2), (6, 3, 2), lambda a, b: jnp.einsum("mkb,knb->bmn", a, b)),
    "outer": ((5,), (4,), lambda a, b: jnp.outer(a, b)),
    "dot": ((100,), (100,), lambda a, b: jnp.dot(a, b)),
    "empty-k": ((3, 0), (0, 4), lambda a, b: a @ b),
}


@pytest.mark.parametrize("name", DOTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8], ids=lambda d: np.dtype(d).name)
def test_dot_general(name, dtype):
    lhs, rhs, f = DOTS[name]
    a, b = rand(lhs, seed=1), rand(rhs, seed=2)
    if np.dtype(dtype).kind == "i":
        a, b = (a * 3).round(), (b * 3).round()
    assert_matches_cpu(f, a.astype(dtype), b.astype(dtype), target=SMALL,
                       rtol=1e-5 if dtype == np.float32 else None, atol=1e-5 if dtype == np.float32 else None)


def test_preferred_element_type():
    a, b = rand((16, 32), np.float16), rand((32, 8), np.float16, seed=1)
    assert_matches_cpu(lambda a, b: lax.dot(a, b, preferred_element_type=jnp.float32), a, b,
                       rtol=1e-5, atol=1e-5, target=SMALL)
    ai, bi = values(np.int8, (6, 10)), values(np.int8, (10, 3), seed=1)
    assert_matches_cpu(lambda a, b: lax.dot(a, b, preferred_element_type=jnp.int32), ai, bi, target=SMALL)


def test_matmul_splits_k_and_sums_partials_in_order():
    """A long K on few rows: the planner splits K, each tile makes a partial
    product of its K-chunk, and a reduce stage sums them in chunk order."""
    target = get_target("ipu2", num_tiles=64)
    a, b = rand((4, 4096)), rand((4096, 4), seed=1)
    program = compile_fn(lambda a, b: a @ b, a, b, target=target)
    kernels = [s.compute_set.kernel for s in leaves(program.body) if isinstance(s, Execute)]
    partials = [k for k in kernels if isinstance(k, codelets.MatMulPartials)]
    assert len(partials) == 1
    chunks = partials[0].out.shape[0]
    assert chunks > 1 and any(isinstance(k, codelets.ReduceCombine) for k in kernels)
    out = run_ipu(lambda a, b: a @ b, a, b, target=target)[0]
    size = 4096 // chunks
    expected = sum(a[:, j * size:(j + 1) * size] @ b[j * size:(j + 1) * size] for j in range(chunks))
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_matmul_plan_respects_memory_budget():
    target = get_target("ipu2")
    roomy = plan_matmul(target, 1, 1024, 1024, 1024, np.dtype(np.float32), np.dtype(np.float32), 0.6)
    tight = plan_matmul(target, 1, 1024, 1024, 1024, np.dtype(np.float32), np.dtype(np.float32), 0.25)
    assert roomy.tiles <= target.num_tiles and tight.tiles <= target.num_tiles
    assert roomy.temporary_bytes <= 0.6 * target.bytes_per_tile
    assert tight.temporary_bytes <= 0.25 * target.bytes_per_tile
    assert tight.cycles >= roomy.cycles
    fp16 = plan_matmul(target, 1, 1024, 1024, 1024, np.dtype(np.float16), np.dtype(np.float32), 0.6)
    assert fp16.cycles < roomy.cycles   # AMP runs fp16 at four times the fp32 rate


REDUCTIONS = {
    "sum": (jnp.sum, [np.float32, np.float16, np.int32, np.uint8]),
    "max": (jnp.max, [np.float32, np.float16, np.int16, np.uint32, np.bool_]),
    "min": (jnp.min, [np.float32, np.int8]),
    "prod": (jnp.prod, [np.float32, np.int32]),
    "all": (jnp.all, [np.bool_]),
    "any": (jnp.any, [np.bool_]),
}


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2), -1], ids=str)
@pytest.mark.parametrize("name, dtype", [(n, d) for n, (_, ds) in REDUCTIONS.items() for d in ds],
                         ids=lambda x: x if isinstance(x, str) else np.dtype(x).name)
def test_reduce(name, dtype, axis):
    fn = REDUCTIONS[name][0]
    x = values(dtype, (6, 7, 9))
    if name in ("sum", "prod") and np.dtype(dtype).kind == "f":   # no cancelling edge values
        x = (rand((6, 7, 9)) / (10 if name == "prod" else 1)).astype(dtype)
    elif name == "prod":
        x = x % 3
    f = lambda a: fn(a, axis=axis)  # noqa: E731
    assert_matches_cpu(f, x, rtol=2e-5 if dtype == np.float32 else None, target=SMALL)


@pytest.mark.parametrize("shape", [(0,), (4, 0), (3000,), (1001, 3)], ids=str)
def test_reduce_shapes(shape):
    x = rand(shape)
    assert_matches_cpu(lambda a: (jnp.sum(a, axis=0), jnp.max(a, axis=-1, initial=-5.0)), x,
                       rtol=1e-5, atol=1e-5, target=SMALL)


def test_full_reduction_is_partitioned_over_tiles():
    x = rand((4096,))
    program = compile_fn(jnp.sum, x)
    kernels = [s.compute_set.kernel for s in leaves(program.body) if isinstance(s, Execute)]
    partial = next(k for k in kernels if isinstance(k, codelets.ReducePartials))
    chunks = partial.out.shape[1]
    assert 1 < chunks <= SMALL.num_tiles
    out = run_ipu(jnp.sum, x)[0]
    expected = np.add.reduce(np.add.reduce(x.reshape(chunks, -1), axis=1))
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    np.testing.assert_allclose(out, np.sum(x, dtype=np.float64), rtol=1e-5)


def test_fp16_sums_accumulate_in_fp32():
    x = np.full(4096, 0.1, np.float16)
    out = run_ipu(jnp.sum, x)[0]
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, np.float16(4096 * np.float32(np.float16(0.1))), rtol=1e-3)
