"""Large fused element-wise chains run on numpy (test_chains_on_xla_cpu.py has
those XLA:CPU runs) in cache-sized chunks: the values are bit for bit those
of the whole-array evaluation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import SMALL, compile_fn
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.model import registry
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import chains as chains_executor
from jax_ipu.model.fast import xla_chains
from jax_ipu.model.fast.views import reader


@pytest.fixture(autouse=True)
def numpy_chains(monkeypatch):
    monkeypatch.setattr(xla_chains, "ENABLED", False)


def _both(monkeypatch, program, inputs, donated=frozenset()):
    chunked = Engine(SMALL).run(program, [a.copy() for a in inputs], donated)
    monkeypatch.setattr(chains_executor, "CHAIN_CHUNK", 1 << 40)   # one chunk: the whole-array evaluation
    monkeypatch.setattr(chains_executor, "FAST_CHAIN_CHUNK", 1 << 40)
    whole = Engine(SMALL).run(program, [a.copy() for a in inputs], donated)
    return chunked, whole


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_chunked_chain_is_bitwise_identical(monkeypatch, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 50_001)).astype(dtype)
    y = rng.standard_normal((3, 50_001)).astype(dtype)

    def f(a, b):
        t = jnp.tanh(a * 1.5 + 0.25) * jnp.exp(-a * a) + jnp.maximum(b, 0)
        return t, jnp.where(a > b, t, b).astype(jnp.int32), a * 2
    program = compile_fn(f, x, y)
    chains = [s.compute_set.kernel for s in leaves(program.body) if isinstance(s, Execute)
              and isinstance(s.compute_set.kernel, codelets.ElementwiseChain)]
    assert chains and all(registry.build(c, reader).__name__ == "run_chunked" for c in chains)
    chunked, whole = _both(monkeypatch, program, [x, y])
    for c, w in zip(chunked, whole, strict=True):
        assert c.dtype == w.dtype and c.shape == w.shape
        np.testing.assert_array_equal(c, w)


def test_chunked_chain_writes_a_donated_input_in_place(monkeypatch):
    from jax_ipu.compiler import compile_module
    from jax_ipu.stablehlo import import_module
    x = np.random.default_rng(1).standard_normal(200_000).astype(np.float32)
    text = jax.jit(lambda a: jnp.sin(a) * 3 + a, donate_argnums=0).lower(x).as_text()
    program = compile_module(import_module(text), SMALL)
    assert program.in_place == {0: 0}
    donated = x.copy()
    out = Engine(SMALL).run(program, [donated], frozenset({0}))[0]
    assert out is donated
    chunked, whole = _both(monkeypatch, program, [x])
    np.testing.assert_array_equal(out, whole[0])
    np.testing.assert_array_equal(chunked[0], whole[0])


def test_chain_on_a_transposed_layout_gives_the_same_values():
    """An input laid out transposed (what a transposing copy leaves) is
    copied once to C order, then evaluated in chunks as any other."""
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((2, 600, 400)).astype(np.float32)
    program = compile_fn(lambda a, b: jnp.tanh(a) * 0.5 - b, x, y)
    want = Engine(SMALL).run(program, [x, y])[0]
    got = Engine(SMALL).run(program, [np.asfortranarray(x), y])[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(784, 512), (1100, 1000)])   # one thread; two halves
def test_chain_of_fast_ops_writes_its_last_op_into_the_output(monkeypatch, shape):
    """An SGD-like update with weight decay (ops numpy runs at memory
    speed; a plain w - c * g is one BLAS axpy, test_sgd_updates_round_once.py) of a
    donated buffer: big chunks, the last op writing straight into the
    buffer, on one thread or two halves: the values of the whole-array
    evaluation."""
    from jax_ipu.compiler import compile_module
    from jax_ipu.stablehlo import import_module
    from jax_ipu.targets import get_target
    target = get_target("ipu2", num_tiles=64)
    rng = np.random.default_rng(3)
    w = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    text = jax.jit(lambda w, g: w * 0.99 - 0.01 * g, donate_argnums=0).lower(w, g).as_text()
    program = compile_module(import_module(text), target)
    [chain] = [s.compute_set.kernel for s in leaves(program.body) if isinstance(s, Execute)]
    assert registry.build(chain, reader).__name__ == "run_chunked"
    donated = w.copy()
    out = Engine(target).run(program, [donated, g], frozenset({0}))[0]
    assert out is donated
    np.testing.assert_array_equal(out, w * np.float32(0.99) - np.float32(0.01) * g)
    fresh = Engine(target).run(program, [w.copy(), g])[0]
    np.testing.assert_array_equal(fresh, out)
    monkeypatch.setattr(chains_executor, "FAST_CHAIN_CHUNK", 1 << 40)
    monkeypatch.setattr(chains_executor, "FAST_SHARED_CHAIN", 1 << 40)
    whole = Engine(target).run(program, [w.copy(), g])[0]
    np.testing.assert_array_equal(whole, out)
