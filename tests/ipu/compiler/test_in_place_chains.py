"""A fused element-wise cluster writes a result into an operand tensor that
dies with it (lowering/elementwise.py, as popops' in-place element-wise
ops and XLA's buffer assignment reuse a dead operand's buffer): the
memory plan then holds one tensor where it held two. Every case where the
operand is still read, read in another order, or not the block's own,
keeps it."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu, compile_fn
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Execute, leaves

rng = np.random.default_rng(0)


def chains(program) -> list[codelets.ElementwiseChain]:
    return [s.compute_set.kernel for s in leaves(program.body) if isinstance(s, Execute)
            and isinstance(s.compute_set.kernel, codelets.ElementwiseChain)]


def written_in_place(kernel) -> list:
    read = {v.tensor.id for v in kernel.inputs if hasattr(v, "tensor")}
    return [t for _, t in kernel.outputs if t.id in read]


def two_reductions(x):
    # y is made by one cluster and read by a reduction (which ends that
    # cluster); the next cluster reads y for the last time: its result
    # may take y's memory.
    y = jnp.sin(x) * 2.0
    s = jnp.sum(y, axis=0)
    return jnp.exp(y) - s


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_dying_operand_takes_the_result(dtype):
    x = rng.standard_normal((64, 96)).astype(dtype)
    program = compile_fn(two_reductions, x)
    reused = [t for k in chains(program) for t in written_in_place(k)]
    assert len(reused) == 1 and reused[0].shape == (64, 96) and reused[0].dtype == dtype
    assert_matches_cpu(two_reductions, x, rtol=2e-3 if dtype == np.float16 else 2e-6,
                       atol=2e-3 if dtype == np.float16 else 1e-5)
    # The result is y's tensor: the program makes one [64, 96] tensor
    # (and reads the argument), where it made two.
    assert program.outputs[0].tensor is reused[0]
    made = [t for t in program.tensors if t.shape == (64, 96) and t.dtype == dtype
            and t.id not in {i.id for i in program.inputs}]
    assert made == reused


def read_after(x):
    y = jnp.sin(x) * 2.0
    s = jnp.sum(y, axis=0)
    return jnp.exp(y) - s, y[::2] + 1.0          # y read again after exp(y)


def read_transposed(x):
    y = jnp.sin(x) * 2.0
    s = jnp.sum(y)
    return jnp.exp(y) + y.T * s                  # y read in another order too


def read_reversed(x):
    y = jnp.sin(x) * 2.0
    s = jnp.sum(y)
    return jnp.exp(y) + y[::-1, ::-1] * s + y[0]  # and reversed, and broadcast


def other_dtype(x):
    y = jnp.sin(x) * 2.0
    s = jnp.sum(y)
    return (y > s).astype(jnp.int32)             # no result of y's type


def program_input(x):
    return jnp.exp(x) * 2.0                       # x is the caller's


@pytest.mark.parametrize("f", [read_after, read_transposed, read_reversed, other_dtype, program_input])
def test_operands_still_needed_are_kept(f):
    x = rng.standard_normal((48, 48)).astype(np.float32)
    program = compile_fn(f, x)
    inputs = {t.id for t in program.inputs}
    for k in chains(program):
        for t in written_in_place(k):
            # Only a tensor the program made, read by the chain whole and in
            # its own order only (a transposed copy is another tensor).
            assert t.id not in inputs
            assert all(v.ops == () for v in k.inputs if getattr(v, "tensor", None) is t)
            assert f not in (other_dtype, program_input)
            assert f is not read_after or t.shape != (48, 48)     # y is read after
    assert_matches_cpu(f, x, rtol=2e-6, atol=1e-5)


def test_in_place_in_a_loop_body_and_across_iterations():
    def f(x):
        def body(i, c):
            y = jnp.tanh(c) + i
            return jnp.exp(-y * y) + jnp.sum(y) * 1e-3
        return lax.fori_loop(0, 5, body, x)
    x = rng.standard_normal((32, 40)).astype(np.float32)
    assert_matches_cpu(f, x, rtol=2e-5, atol=1e-5)


def test_many_outputs_only_one_takes_the_operand():
    def f(x):
        y = jnp.cos(x) + 1.0
        s = jnp.max(y)
        return y * s, y - s, jnp.sqrt(y)
    x = rng.standard_normal((40, 50)).astype(np.float32)
    program = compile_fn(f, x)
    assert all(len(written_in_place(k)) <= 1 for k in chains(program))
    assert_matches_cpu(f, x, rtol=2e-6, atol=1e-6)
