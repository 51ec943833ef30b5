"""The engine skips the host side of layout Copies (transpose, broadcast,
slice) whose destination only element-wise chains, matmul operands or
other Copies read, later in the same sequence, while nothing writes the
source (model/fast/lazy_copies.py): those readers take the source through the
composed view. The program (its Copies, exchange, cycles, memory plan) is
unchanged, and so is every value element-wise kernels and Copies make,
bit for bit. BLAS may round a product of a transposed operand otherwise
than one of its copy (OpenBLAS's small-matrix kernels differ by
transposition), so products are compared within 1e-6 of each other; runs
of one program always agree. Cases where the source changes before the
read must keep the copy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn
from jax_ipu.compiler import compile_module
from jax_ipu.graph.programs import Copy, leaves
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import lazy_copies as lazy_module
from jax_ipu.model.fast.lazy_copies import lazy_copies
from jax_ipu.stablehlo import import_module

rng = np.random.default_rng(0)


def both(program, inputs, donated=frozenset()):
    """(results with lazy copies, results with every copy made)."""
    lazy = Engine(SMALL).run(program, [a.copy() for a in inputs], donated)
    lazy_module.LAZY_COPIES = False
    try:
        eager = Engine(SMALL).run(program, [a.copy() for a in inputs], donated)
    finally:
        lazy_module.LAZY_COPIES = True
    return lazy, eager


def same(a, b, exact=True):
    assert a.dtype == b.dtype and a.shape == b.shape
    if exact:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def check_lazy_copies(f, *args, exact=True):
    """f's program skips copies, and gives the same results lazily and
    eagerly (bit for bit, or within 1e-5 with exact=False), run after run,
    and XLA:CPU's within 2e-5."""
    program = compile_fn(f, *args)
    skipped = lazy_copies(program)
    assert skipped
    lazy, eager = both(program, list(args))
    again = Engine(SMALL).run(program, [a.copy() for a in args])
    for a, b, c in zip(lazy, eager, again, strict=True):
        same(a, b, exact)
        np.testing.assert_array_equal(a, c)
    assert_matches_cpu(f, *args, got=lazy, rtol=2e-5, atol=2e-5)
    return program, skipped


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_transposed_matmul_operands_are_read_in_place():
    x, w = f32(64, 96), f32(48, 96)
    program, skipped = check_lazy_copies(lambda x, w: (x.T @ x, x @ w.T), x, w, exact=False)
    copies = [s for s in leaves(program.body) if isinstance(s, Copy)]
    assert copies and {s.dst.id for s in copies} <= set(skipped)


def test_bias_broadcast_read_by_a_chain():
    """No copy at all: the chain's vertices read the bias as a broadcast
    view (test_broadcasts_read_in_place.py)."""
    x, b = f32(128, 40), f32(40)
    f = (lambda x, b: jax.nn.relu(x + b) * b[None, :])
    assert not [s for s in leaves(compile_fn(f, x, b).body) if isinstance(s, Copy)]
    assert_matches_cpu(f, x, b)


def test_training_step_with_donation_matches_eager_copies():
    """A dense layer's forward and backward, the parameters donated: the
    transposes of donated weights are read before the update writes them."""
    def step(w, b, x):
        def loss(w, b):
            return jnp.sum(jnp.tanh(x @ w + b) ** 2)
        gw, gb = jax.grad(loss, argnums=(0, 1))(w, b)
        return w - 0.1 * gw, b - 0.1 * gb
    w, b, x = f32(32, 16), f32(16), f32(8, 32)
    text = jax.jit(step, donate_argnums=(0, 1)).lower(w, b, x).as_text()
    program = compile_module(import_module(text), SMALL)
    assert program.in_place and lazy_copies(program)
    lazy, eager = both(program, [w, b, x], frozenset({0, 1}))
    for a, e in zip(lazy, eager, strict=True):
        same(a, e, exact=False)
    want = jax.jit(step)(w, b, x)
    for a, e in zip(lazy, want, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_slices_and_transposes_in_chains(dtype):
    x = (rng.standard_normal((30, 20)) * 10).astype(dtype)
    check_lazy_copies(lambda x: (x[::2, 1:] * 2 + x.T[1:, ::2].T, jnp.broadcast_to(x[0], (5, 20)) - x[:5]), x)


def test_inside_a_loop_body():
    def f(x, w):
        def body(_, c):
            return jnp.tanh(c @ w.T + c.T[0][:, None] * 0.01)
        return lax.fori_loop(0, 5, body, x)
    check_lazy_copies(f, f32(16, 16), f32(16, 16), exact=False)


def test_copy_of_a_view_of_a_copy():
    """A copy read by another copy: the second reads the first's source."""
    x = f32(12, 10, 8)
    check_lazy_copies(lambda x: jnp.transpose(x, (2, 0, 1)).reshape(8, 120).T @ jnp.ones((8, 3), jnp.float32), x,
                      exact=False)


def test_source_updated_in_place_before_the_read_keeps_the_copy():
    """scan writes its carried buffer in place after the transposed read
    was taken: the read must see the values from before."""
    def f(x):
        def body(c, _):
            t = c.T                        # a Copy of c
            c = c.at[0].set(c[1] + 1.0)    # c updated in place
            return c, (t * 2.0)[0]          # reads the old c, transposed
        return lax.scan(body, x, None, length=4)
    x = f32(6, 6)
    program = compile_fn(f, x)
    lazy, eager = both(program, [x])
    for a, b in zip(lazy, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    assert_matches_cpu(f, x, got=lazy, rtol=1e-6, atol=0)


def test_outputs_and_other_readers_keep_their_copies():
    """A transposed output is returned (a copy of its own), and a
    transpose read by a reduction (not a view reader) is made."""
    x = f32(20, 30)
    program = compile_fn(lambda x: (x.T, jnp.sum(x.T * 1.0, axis=1)), x)
    skipped = lazy_copies(program)
    outputs = {v.tensor.id for v in program.outputs}
    assert not outputs & set(skipped)
    lazy, eager = both(program, [x])
    for a, b in zip(lazy, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(lazy[0], x.T)


def test_the_profile_still_counts_the_copies():
    """Skipped on the host, the Copies are still the program's: the run
    record (cycles, exchange) is the same either way."""
    x, w = f32(64, 96), f32(48, 96)
    program = compile_fn(lambda x, w: jnp.tanh(x @ w.T + w[0, :48]), x, w)
    assert lazy_copies(program)
    model = Engine(SMALL)
    model.run(program, [x, w])
    lazy_record = model.last_run
    lazy_module.LAZY_COPIES = False
    try:
        model = Engine(SMALL)
        model.run(program, [x, w])
    finally:
        lazy_module.LAZY_COPIES = True
    assert lazy_record.cycles == model.last_run.cycles
    assert lazy_record.compute_sets == model.last_run.compute_sets


def test_through_the_plugin(ipu):
    x, w = f32(128, 784), f32(784, 64)
    f = jax.jit(lambda x, w: jax.grad(lambda w: jnp.sum(jax.nn.relu(x @ w + 1.0)))(w))
    got = f(jax.device_put(x, ipu), jax.device_put(w, ipu))
    np.testing.assert_allclose(np.asarray(got), np.asarray(f(x, w)), rtol=1e-5, atol=1e-4)
