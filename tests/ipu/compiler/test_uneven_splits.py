"""Reductions and products over lengths with no divisor that spreads them
(primes, twice a prime): a reduction's operand is padded with the init
value, a product's K with zeros (when no even split fits), so that the
work still spreads over the tiles instead of one tile taking everything (a
sum of 300,007 float32, a [1, 100003] x [100003, 3] product: out of memory
on tile 0). Values against JAX's CPU backend: f32 sums within 1e-4
relative, selections and integers exact."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn, run_on
from jax_ipu.compiler.lowering import reduce as compiler_reduce
from jax_ipu.compiler.planners.matmul import plan_matmul
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.targets import get_target

IPU2 = get_target("ipu2")


@pytest.mark.parametrize("reduced,kept,tiles,chunks,size,pad", [
    (300_007, 1, 1472, 1471, 204, 77), (1_000_003, 1, 1472, 1471, 680, 277),     # primes
    (1009, 15, 1472, 15, 68, 11),               # limited by the 64-element minimum chunk
    (1 << 20, 1, 1472, 1024, 1024, 0),          # a power of two splits evenly
    (300_000, 1, 1472, 1250, 240, 0),           # so does a round number
    (97, 3, 1472, 1, 97, 0),                    # too short to split
])
def test_chunking(reduced, kept, tiles, chunks, size, pad):
    got = compiler_reduce._chunking(reduced, kept, tiles, 64)
    assert got == (chunks, size, pad)
    assert chunks * size == reduced + pad and pad < size


def test_a_prime_length_sum_spreads_over_the_tiles():
    x = np.ones(300_007, np.float32)
    program = compile_fn(lambda a: jnp.sum(a * a), x, target=IPU2)
    partials = [s for s in leaves(program.body) if isinstance(s, Execute)
                and isinstance(s.compute_set.kernel, codelets.ReducePartials)]
    assert partials and max(len({v.tile for v in s.compute_set.vertices}) for s in partials) > 1000


PRIME = 30_011


@pytest.mark.parametrize("fn", [
    lambda a: jnp.sum(a), lambda a: jnp.max(a), lambda a: jnp.min(a * 3), lambda a: jnp.argmax(a),
    lambda a: jnp.prod(1 + a * 1e-4), lambda a: jnp.mean(a * a), lambda a: jnp.any(a > 3.9),
    lambda a: jnp.all(a < 4.5), lambda a: jnp.sum(a.astype(jnp.int32)),
    lambda a: jnp.mean(a.astype(jnp.float16)),
], ids=["sum", "max", "min", "argmax", "prod", "mean", "any", "all", "int_sum", "f16_mean"])
def test_prime_length_reductions_match_cpu(fn):
    x = np.random.default_rng(0).standard_normal(PRIME).astype(np.float32)
    assert_matches_cpu(fn, x, rtol=1e-2, atol=1e-2)      # (fp16's mean; the float32 ones agree to 1e-5 or better)


@pytest.mark.parametrize("shape,axes", [
    ((1009, 16), (0,)),            # reduced dims leading (outer)
    ((16, 1009), (1,)),            # trailing
    ((3, 1009, 5), (1,)),          # in the middle: transposed, then padded
    ((2, 1013, 7), (0, 1)),        # two of them
])
def test_prime_lengths_in_every_layout(shape, axes):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    assert_matches_cpu(lambda a: (jnp.sum(a, axis=axes), jnp.max(a, axis=axes), jnp.argmin(a, axis=axes[-1])), x,
                       rtol=1e-4, atol=1e-4)


def test_init_value_computed_at_run_time():
    """The padding holds the init value however it is made (StableHLO lets
    a reduction apply it any number of times: an identity, as JAX passes)."""
    x = np.random.default_rng(2).standard_normal(PRIME).astype(np.float32)
    assert_matches_cpu(lambda a, lo: lax.reduce(a, lo, lax.max, (0,)), x, np.float32(-np.inf), rtol=1e-4, atol=1e-4)
    assert_matches_cpu(lambda a, z: lax.reduce(a, z, lax.add, (0,)), x, np.float32(0.0), rtol=1e-4, atol=1e-4)
    y = np.random.default_rng(3).integers(0, 1000, PRIME).astype(np.int32)

    def body(u, v):         # the largest value, the lowest index among equals (order-free)
        take = (u[0] > v[0]) | ((u[0] == v[0]) & (u[1] < v[1]))
        return jnp.where(take, u[0], v[0]), jnp.where(take, u[1], v[1])
    assert_matches_cpu(lambda a, i: lax.reduce((a, i), (np.int32(-1), np.int32(PRIME)), body, (0,)), y,
                       np.arange(PRIME, dtype=np.int32), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,k,n", [(1, 100_003, 3), (4, 300_007, 1), (2, 50_021, 8)])
def test_a_long_prime_k_is_padded_when_no_even_split_fits(m, k, n):
    f32 = np.dtype(np.float32)
    plan = plan_matmul(IPU2, 1, m, n, k, f32, f32, 0.6)
    chunks, size = plan.splits[3], plan.blocks[3]
    assert chunks > 100 and chunks * size >= k > (chunks - 1) * size
    assert plan.temporary_bytes <= 0.6 * IPU2.bytes_per_tile


def test_k_that_splits_evenly_is_planned_as_before():
    f32 = np.dtype(np.float32)
    plan = plan_matmul(IPU2, 1, 128, 512, 784, f32, f32, 0.6)
    assert 784 % plan.splits[3] == 0 and plan.splits[3] * plan.blocks[3] == 784


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16], ids=lambda d: np.dtype(d).name)
def test_products_over_a_long_prime_k_match_cpu(dtype):
    rng = np.random.default_rng(4)
    a = rng.integers(-3, 4, (2, 100_003)).astype(dtype)
    b = rng.integers(-3, 4, (100_003, 3)).astype(dtype)
    x = rng.standard_normal(300_007).astype(np.float32)
    if dtype == np.float16:     # exact small integers, sums within fp16's range
        a, b = a[:, :20_011] * 0 + a[:, :20_011] % 2, b[:20_011] % 2
    assert_matches_cpu(lambda a, b: (a @ b, jnp.einsum("ik,kj->ij", a, b)), a, b, rtol=0, atol=0)
    assert_matches_cpu(lambda x: jnp.dot(x, x), x, rtol=1e-4, atol=1e-4)


def test_gradient_through_a_padded_product():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((1, 100_003)).astype(np.float32), rng.standard_normal((100_003, 3)).astype(np.float32)
    got = run_on(jax.devices("ipu")[0], jax.grad(lambda a: jnp.sum((a @ b) ** 2)), a)
    exact = 2 * (a.astype(np.float64) @ b) @ b.T
    # Against float64 (XLA:CPU's own float32 result is 5e-3 off on values of ~4e3).
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


# Products too big for one plan on the tiles at once: rows or columns in
# blocks computed one after the other (PopLibs' serial splits).
from jax_ipu.compiler.lowering import matmul as compiler_matmul  # noqa: E402


@pytest.mark.parametrize("m,k,n", [(512, 768, 50257), (4096, 1024, 4096), (8192, 768, 3072), (3072, 3072, 3072)])
def test_serial_steps_cover_the_product_and_each_fits(m, k, n):
    f32 = np.dtype(np.float32)
    assert plan_matmul(IPU2, 1, m, n, k, f32, f32, 0.6).temporary_bytes > 0.6 * IPU2.bytes_per_tile
    steps = compiler_matmul._serial_steps(IPU2, 1, m, n, k, f32, f32, 0.6)
    assert steps is not None and 2 <= len(steps) <= 64
    covered = np.zeros((m, n), np.int8)
    for r0, r1, c0, c1, plan in steps:
        covered[r0:r1, c0:c1] += 1
        assert plan.temporary_bytes <= 0.6 * IPU2.bytes_per_tile
    assert (covered == 1).all()


def test_a_product_too_big_for_one_plan_runs_in_serial_steps():
    rng = np.random.default_rng(8)
    a = rng.standard_normal((512, 512)).astype(np.float32)
    w = rng.standard_normal((512, 520)).astype(np.float32)
    program = compile_fn(lambda a, w: a @ w, a, w)
    products = [s for s in leaves(program.body) if isinstance(s, Execute)
                and isinstance(s.compute_set.kernel, codelets.MatMulPartials)]
    assert len(products) >= 2
    assert_matches_cpu(lambda a, w: a @ w, a, w, target=SMALL, rtol=1e-4, atol=1e-3)


def test_gradients_through_serial_products():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((512, 512)).astype(np.float32) * 0.1
    w = rng.standard_normal((512, 520)).astype(np.float32) * 0.1

    def loss(w, x):
        return jnp.mean(jax.nn.log_softmax(x @ w) ** 2)
    grad = jax.grad(loss)
    assert_matches_cpu(grad, w, x, target=SMALL, rtol=1e-3, atol=1e-6)


def test_an_lm_head_too_big_for_one_plan_fits_the_ipu():
    """GPT-2's vocabulary: [512, 768] x [768, 50257] (154 MB of weights)."""
    f32 = np.zeros((), np.float32)
    x = jax.ShapeDtypeStruct((512, 768), f32.dtype)
    w = jax.ShapeDtypeStruct((768, 50257), f32.dtype)
    program = compile_fn(lambda x, w: x @ w, x, w, target=IPU2)
    products = [s for s in leaves(program.body) if isinstance(s, Execute)
                and isinstance(s.compute_set.kernel, codelets.MatMulPartials)]
    assert len(products) >= 2
