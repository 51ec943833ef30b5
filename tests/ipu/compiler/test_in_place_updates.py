"""dynamic_update_slice writes into its operand's tensor when nothing reads
the operand afterwards (compiler Builder.writable_in_place), as XLA's buffer
assignment does: a scan's stacked outputs are then updated in place, not
copied twice per iteration. Every case where the old value is still read
must keep it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn
from jax_ipu.graph import codelets_indexing as ci
from jax_ipu.graph.programs import Copy, Execute, Repeat, leaves

rng = np.random.default_rng(0)


def updates(program) -> list[ci.DynamicUpdateSlice]:
    return [s.compute_set.kernel for s in leaves(program.body) if isinstance(s, Execute)
            and isinstance(s.compute_set.kernel, ci.DynamicUpdateSlice)]


def in_place(kernel) -> bool:
    return kernel.out is kernel.operand.tensor


def scan_stack(x):
    def step(c, _):
        c = jnp.sin(c) + 0.1
        return c, c * 2
    return lax.scan(step, x, None, length=50)


def test_scan_outputs_are_stacked_in_place():
    x = rng.standard_normal(300).astype(np.float32)
    program = compile_fn(scan_stack, x)
    [dus] = updates(program)
    assert in_place(dus)
    # The loop body copies no [50, 300] buffer.
    [loop] = [s for s in program.body.steps if isinstance(s, Repeat)]
    assert not [s for s in leaves(loop.body) if isinstance(s, Copy) and s.dst.shape == (50, 300)]
    assert_matches_cpu(scan_stack, x, target=SMALL, rtol=1e-6, atol=1e-6)


def test_through_the_plugin_many_iterations(ipu):
    def f(x):
        return lax.scan(lambda c, _: (c * 0.5 + 1.0, c), x, None, length=400)
    x = rng.standard_normal((20, 30)).astype(np.float32)
    got = jax.jit(f)(jax.device_put(x, ipu))
    want = jax.jit(f)(x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_operand_read_afterwards_is_kept():
    def f(a):
        x = a * 2
        y = x.reshape(4, 5)                  # a view of x's tensor, read after the update
        z = lax.dynamic_update_slice(x, jnp.ones(3, x.dtype), (4,))
        return z, y + 1, x - 1
    a = rng.standard_normal(20).astype(np.float32)
    assert not any(in_place(k) for k in updates(compile_fn(f, a)))
    assert_matches_cpu(f, a, target=SMALL, rtol=1e-6, atol=1e-6)


def test_last_use_is_updated_in_place():
    def f(a, i):
        x = a * 2
        return lax.dynamic_update_slice(x, jnp.full((2, 3), 7.0, x.dtype), (i, i))
    a = rng.standard_normal((6, 6)).astype(np.float32)
    i = np.int32(3)
    assert all(in_place(k) for k in updates(compile_fn(f, a, i)))
    assert_matches_cpu(f, a, i, target=SMALL, rtol=1e-6, atol=1e-6)


def test_program_inputs_and_loop_invariants_are_never_written(ipu):
    def f(a, base):
        def body(i, c):
            # base is read again on every iteration; a is the program's input
            return c + lax.dynamic_update_slice(base, jnp.full((1,), i, base.dtype), (i,))
        return lax.fori_loop(0, 5, body, jnp.zeros_like(base)), lax.dynamic_update_slice(a, a[:2] * 0, (0,))
    a = rng.standard_normal(8).astype(np.float32)
    base = rng.standard_normal(8).astype(np.float32)
    assert not any(in_place(k) for k in updates(compile_fn(f, a, base)))
    assert_matches_cpu(f, a, base, target=SMALL, rtol=1e-6, atol=1e-6)
    da, db = jax.device_put(a, ipu), jax.device_put(base, ipu)
    jax.block_until_ready(jax.jit(f)(da, db))
    np.testing.assert_array_equal(np.asarray(da), a)     # the inputs are untouched
    np.testing.assert_array_equal(np.asarray(db), base)


def test_swapped_carried_values_keep_the_old_one():
    def f(p, q):
        def body(i, pq):
            p, q = pq
            return q, lax.dynamic_update_slice(p, jnp.full((1,), i, p.dtype), (i,))
        return lax.fori_loop(0, 6, body, (p, q))
    p = rng.standard_normal(8).astype(np.float32)
    q = rng.standard_normal(8).astype(np.float32)
    assert_matches_cpu(f, p, q, target=SMALL, rtol=1e-6, atol=1e-6)

    def g(c):
        def body(i, c):
            return lax.dynamic_update_slice(c, lax.dynamic_slice(c, (i,), (1,)) + 1.0, (i + 1,)) * 1.0 + c
        return lax.fori_loop(0, 5, body, c)
    assert_matches_cpu(g, p, target=SMALL, rtol=1e-6, atol=1e-6)


def scatters(program) -> list[ci.Scatter]:
    return [s.compute_set.kernel for s in leaves(program.body) if isinstance(s, Execute)
            and isinstance(s.compute_set.kernel, ci.Scatter)]


def test_scatter_accumulates_in_place_in_a_loop():
    def histogram(xs):
        def body(i, h):
            return h.at[xs[i]].add(1.0).at[xs[i] // 2].max(0.5)
        return lax.fori_loop(0, xs.shape[0], body, jnp.zeros(16, jnp.float32))
    xs = rng.integers(0, 16, 64).astype(np.int32)
    program = compile_fn(histogram, xs)
    assert scatters(program) and all(k.outs[0] is k.operands[0].tensor for k in scatters(program))
    assert_matches_cpu(histogram, xs, target=SMALL, rtol=1e-6, atol=1e-6)


def test_scatter_keeps_an_operand_read_later():
    def f(a, idx, u):
        x = a + 1
        y = x.at[idx].set(u)
        return y, x * 2
    a = rng.standard_normal(10).astype(np.float32)
    idx, u = np.array([1, 3], np.int32), np.array([5.0, 6.0], np.float32)
    assert not any(k.outs[0] is k.operands[0].tensor for k in scatters(compile_fn(f, a, idx, u)))
    assert_matches_cpu(f, a, idx, u, target=SMALL, rtol=1e-6, atol=1e-6)

    def g(a, idx, u):      # read after the scatter within one expression
        x = a * 3
        return lax.scatter_add(x, idx[:, None], u, lax.ScatterDimensionNumbers((), (0,), (0,))) + x
    assert_matches_cpu(g, a, idx, u, target=SMALL, rtol=1e-6, atol=1e-6)
