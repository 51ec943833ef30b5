"""A transformer pipeline stage in training at small scale: the 1F1B tick
of benchmarks/models_zoo.py (the busiest stage of Graphcore's BERT and
GPT-2 configurations, docs/models.md) with its layers shrunk, on a
16-tile IPU, float16 weights and float16 partials as Graphcore trained:
it fits, its matmuls keep float16 partials, what it holds at its peak
stays within a small multiple of what the program must keep (its
arguments, the tensors JAX saves for the backward pass, code and vertex
state), and its results match XLA:CPU's. The BERT stage is behind `slow`
(about 20 s of CPU, most of it XLA:CPU's compile and Flax's init):
`pytest -m slow tests/ipu/user_programs/test_transformer_stage.py`."""
from __future__ import annotations

import os
import sys

import jax
import numpy as np
import pytest

from helpers import compile_fn, on_cpu
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"))
import models_zoo  # noqa: E402

TARGET = get_target("ipu2", num_tiles=16)
SHRINK = {"layers": 2, "width": 64, "heads": 4, "hidden": 128, "batch": 2, "length": 32}


@pytest.mark.parametrize("name", [pytest.param("bert-large-128", marks=pytest.mark.slow), "gpt2-small"])
def test_a_shrunk_stage_fits_in_training_and_matches_xla_cpu(name):
    tick, args = models_zoo.stage_train(name, **SHRINK)
    fn = tick.__wrapped__
    args = jax.tree.map(np.asarray, args)
    program = compile_fn(fn, *args, target=TARGET, partials_type="half",
                         available_memory_proportion=models_zoo.STAGES[name][9])
    mem = program.memory
    assert mem.fits, mem.max_bytes
    products = [s.compute_set.kernel for s in leaves(program.body)
                if isinstance(s, Execute) and isinstance(s.compute_set.kernel, codelets.MatMulPartials)]
    assert products and all(k.out.dtype == np.float16 for k in products)
    # The peak against what any plan keeps: the arguments, JAX's saved
    # residuals (a checkpoint per layer: the layers' inputs), code and
    # vertex state. The rest is one layer's recomputed activations, their
    # gradients and the products' operands and partials.
    saved = models_zoo.stage_saved_bytes(name, **SHRINK)
    bound = mem.argument_bytes + saved + int(mem.code.sum())
    assert mem.total_bytes <= 3 * bound, (mem.total_bytes, bound)
    got = Engine(TARGET).run(program, jax.tree.leaves(args))
    want = jax.tree.leaves(on_cpu(fn, *args))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(1.0, float(np.abs(w.astype(np.float32)).max()))
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=0, atol=2e-2 * scale)
