"""Small tensors, partials and small compute sets (and so their code and
vertex state) are spread over the tiles, as Poplar spreads them, instead of
all starting at tile 0: a program of many small tensors has no hot tile,
fits wherever its total fits evenly, and computes what XLA:CPU computes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import compile_fn, run_cpu
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target


def many_small(params, x):
    """A model's worth of small state: per tensor of 64 floats (one tile's
    minimum), an element-wise update and a reduction to a scalar."""
    total = 0.0
    for i, p in enumerate(params):
        total = total + jnp.sum(jnp.tanh(p * x[i]))
    return [p * 0.9 + 0.1 for p in params], total


def small_args(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(64).astype(np.float32) for _ in range(n)], rng.standard_normal(n).astype(np.float32)


def balance(program) -> float:
    peak = program.memory.peak
    return float(peak.max() / peak.mean())


def data_balance(program) -> float:
    """The busiest tile's data over the mean tile's, code and vertex state
    left out: the running sum's one fused expression (all the adds of
    `total`, one codelet popops would generate) holds its code and its
    vertex's state on the tile that runs it (see assert_code_spread)."""
    m = program.memory
    data = m.peak - m.code
    return float(data.max() / data.mean())


def assert_code_spread(program) -> None:
    """Every tile's code and vertex state within 1.5x the mean, but the one
    tile running the running sum's expression, whose excess is at most that
    expression's code and state (PopLibs' figures, targets.codelet_memory)."""
    from jax_ipu.graph.programs import Execute, leaves
    from jax_ipu.targets import codelet_memory
    m = program.memory
    vertices = [v for step in leaves(program.body) if isinstance(step, Execute) for v in step.compute_set.vertices]
    biggest = max(vertices, key=lambda v: len(v.reads))
    code, state = codelet_memory(biggest.codelet, len(biggest.reads), len(biggest.writes))
    others = np.delete(m.code, biggest.tile)
    assert others.max() <= 1.5 * m.code.mean(), (int(others.max()), float(m.code.mean()))
    assert m.code[biggest.tile] <= others.max() + code + state


def test_small_tensors_and_code_are_spread_over_the_tiles():
    target = get_target("ipu2", num_tiles=64)
    program = compile_fn(many_small, *small_args(200), target=target)
    m = program.memory
    # Every tile holds some of it, none much more than the mean: with each
    # small tensor starting at tile 0, tile 0 held 64x the mean.
    assert (m.peak > 0).all()
    assert data_balance(program) <= 1.5, (m.max_tile, m.max_bytes, m.peak.mean())
    assert_code_spread(program)
    args = m.always_live - m.code
    assert args.max() <= 1.5 * args.mean()


def test_a_small_share_of_sram_fits_on_few_tiles():
    # ipu1 (256 KiB a tile): 450 tensors' state is about 300 KB, which
    # tile 0 alone held before; it is a few percent of 16 tiles.
    target = get_target("ipu1", num_tiles=16)
    program = compile_fn(many_small, *small_args(450), target=target, allow_out_of_memory=True)
    m = program.memory
    assert m.total_bytes < 0.2 * target.num_tiles * target.bytes_per_tile
    assert m.fits, m.describe()
    assert data_balance(program) <= 1.5
    assert_code_spread(program)


@pytest.mark.parametrize("tiles", [3, 64])
def test_spread_program_matches_cpu(tiles):
    target = get_target("ipu2", num_tiles=tiles)
    params, x = small_args(24, seed=tiles)
    program = compile_fn(many_small, params, x, target=target)
    got = Engine(target).run(program, [*params, x])
    want = run_cpu(lambda *a: jax.tree.leaves(many_small(list(a[:-1]), a[-1])), *params, x)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_small_matmuls_and_reductions_start_at_varying_tiles():
    """A small MLP's training step: its products, bias gradients and
    partials land on different tiles, and the step matches XLA:CPU."""
    target = get_target("ipu2", num_tiles=64)
    rng = np.random.default_rng(1)
    widths = [16, 24, 8, 4]
    params = [(rng.standard_normal((a, b)).astype(np.float32) / 4, rng.standard_normal(b).astype(np.float32))
              for a, b in zip(widths[:-1], widths[1:], strict=True)]
    x = rng.standard_normal((6, widths[0])).astype(np.float32)

    def step(params, x):
        def loss(params):
            h = x
            for w, b in params:
                h = jnp.tanh(h @ w + b)
            return jnp.mean(h * h)
        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.5 * g, params, grads), value

    program = compile_fn(step, params, x, target=target)
    flat = jax.tree.leaves(params)
    got = Engine(target).run(program, [*flat, x])
    want = run_cpu(lambda *a: jax.tree.leaves(step([(a[0], a[1]), (a[2], a[3]), (a[4], a[5])], a[6])), *flat, x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)
    # Tile 0 is no busier than others (it held every small tensor before).
    m = program.memory
    assert m.peak[0] <= 1.5 * m.peak.mean()
    assert balance(program) <= 2.0
