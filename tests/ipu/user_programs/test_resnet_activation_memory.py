"""ResNet-50's memory at small scale (the textbook Flax model of
benchmarks/models_zoo.py with one bottleneck block in each of two stages,
16 filters, 32x32 images, float16 compute and float32 master weights, on a
64-tile IPU): what the plan keeps grows with the batch by no more than
what JAX's program saves from its forward pass for its backward pass (the
activations' lower bound: jax's saved_residuals), and its convolutions are
all planned (no im2col patches). docs/models.md gives the full-size
figures; with nn.remat per block, against what JAX keeps while it goes
back through one block. Slow (about a minute of CPU: four compiles of a
training step's gradient):
`pytest -m slow tests/ipu/user_programs/test_resnet_activation_memory.py`."""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from helpers import compile_fn
from jax_ipu.graph import programs as p
from jax_ipu.targets import get_target

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"))
import models_zoo  # noqa: E402

TARGET = get_target("ipu2", num_tiles=64)


def _measure(batch: int, remat: bool = False, **size) -> tuple[int, int, list[str]]:
    """(the plan's temporaries, the bytes JAX saves for the backward pass,
    the compute sets' names) of the loss's gradient at `batch`."""
    size = {"image": 32, "stages": (1, 1), "width": 16, **size}
    loss_fn, _, _, variables, x, y = models_zoo.resnet50_parts(batch, jnp.float16, remat=remat, **size)
    loss = lambda params, stats, x, y: loss_fn(params, stats, x, y)[0]  # noqa: E731
    args = (variables["params"], variables["batch_stats"], x, y)
    program = compile_fn(jax.grad(loss), *args, target=TARGET, allow_out_of_memory=True)
    saved = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                for a, why in saved_residuals(loss, *args) if "argument" not in why)
    names = [s.compute_set.name for s in p.leaves(program.body) if isinstance(s, p.Execute)]
    return int(program.memory.not_always_live_peak.sum()), saved, names


@pytest.mark.slow
def test_activation_memory_grows_as_what_jax_saves():
    temporaries_2, saved_2, names = _measure(2)
    temporaries_4, saved_4, _ = _measure(4)
    assert not any("im2col" in n for n in names)
    assert sum(n.startswith("conv ") and "reduce" not in n for n in names) >= 10
    per_image, bound = (temporaries_4 - temporaries_2) / 2, (saved_4 - saved_2) / 2
    # At most a quarter above the bound (the backward pass's own gradients
    # of the largest activations live at the same time as what is saved).
    assert 0 < per_image <= 1.25 * bound, (per_image, bound)


@pytest.mark.slow
def test_activation_memory_with_remat_grows_as_what_jax_keeps():
    """Each block under nn.remat (64x64 images, 10 classes, so that the
    peak is in a block's backward pass, as at full size): the plan's
    temporaries grow an image by at most 1.25x the most JAX's program keeps
    while it goes back through one block (the earlier blocks' inputs, the
    stem's residuals and that block's own recomputed residuals:
    models_zoo.remat_bound_per_image). Measured 1.15x: the rest is the
    block's gradients, live beside its residuals, which no residual count
    includes. (Against the saved residuals alone, the blocks' inputs, it
    is 2.7x: the recomputed block's own residuals are most of it.)"""
    size = {"image": 64, "classes": 10}
    temporaries_2, _, names = _measure(2, remat=True, **size)
    temporaries_4, _, _ = _measure(4, remat=True, **size)
    assert not any("im2col" in n for n in names)
    bound = models_zoo.remat_bound_per_image(4, jnp.float16, stages=(1, 1), width=16, **size)
    per_image = (temporaries_4 - temporaries_2) / 2
    assert 0 < per_image <= 1.25 * bound, (per_image, bound)
