"""A matrix too large for a share of one tile is factorised spread by
blocks of rows over several tiles (compiler/lowering/linalg.py), instead of whole on
one tile: jnp.linalg on a 600x600 or 828x828 matrix fits the default ipu2
(a 300x300 solve used to run out of memory on tile 0)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from helpers import assert_matches_cpu, matrix, spd
from jax_ipu.compiler import compile_module
from jax_ipu.errors import IpuOutOfMemoryError
from jax_ipu.graph.codelets_linalg import Factorize
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.graph.validate import validate
from jax_ipu.stablehlo import import_module
from jax_ipu.targets import get_target

# As test_linalg.py: 1e-4, relative and relative to each result's scale.
SCALED = dict(rtol=1e-4, atol=1e-4, scaled=True)
IPU2 = get_target("ipu2")


def ipu_program(f, *args, target=IPU2):
    """f compiled as the plugin compiles it (the ipu lowerings of LU, eigh, svd)."""
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("ipu",)).as_text(debug_info=True)
    program = compile_module(import_module(text), target)
    validate(program, target.num_tiles)        # every element mapped once, no overlapping writes
    return program


def factorizations(program) -> list[Execute]:
    return [s for s in leaves(program.body) if isinstance(s, Execute) and isinstance(s.compute_set.kernel, Factorize)]


@pytest.mark.parametrize("name, f, make", [
    ("lu", jnp.linalg.inv, spd),
    ("cholesky", jnp.linalg.cholesky, spd),
    ("eigh", lambda a: jnp.linalg.eigh(a)[0], spd),
    ("svd", lambda a: jnp.linalg.svd(a, compute_uv=False), matrix),
])
def test_a_large_matrix_is_spread_over_tiles(name, f, make):
    a = make((600, 600))
    program = ipu_program(f, a)
    [step] = [s for s in factorizations(program) if s.compute_set.kernel.op == name]
    tiles = step.compute_set.tiles()
    assert len(tiles) >= 16                       # 600x600 f32 is 1.4 MB; a tile has 624 KiB
    for out in step.compute_set.kernel.outs:
        if out.size >= 600 * 600:
            assert len(out.mapping.tiles_used()) >= 16
    assert program.memory.fits and program.memory.max_bytes <= IPU2.bytes_per_tile
    # Each round broadcasts a panel of pivot rows: exchange and sync are charged.
    exchange = step.compute_set.exchange
    assert exchange.rounds >= 600 // 16 and step.sync_cycles > 0
    assert exchange.buffers.max() <= 0.25 * IPU2.bytes_per_tile


@pytest.mark.parametrize("f", [
    jnp.linalg.inv,
    lambda a: jnp.linalg.solve(a, jnp.ones(a.shape[0], a.dtype)),
    jnp.linalg.cholesky,
    lambda a: jnp.linalg.eigh(a)[0],
    jnp.linalg.slogdet,
])
def test_large_matrices_match_the_cpu(f):
    assert_matches_cpu(f, spd((600, 600), seed=3), **SCALED)


def test_pinv_of_the_conformance_size():
    # JAX's testPinv1 shape; pinv goes through svd.
    assert_matches_cpu(jnp.linalg.pinv, matrix((828, 828), seed=1), **SCALED)


def test_a_wide_matrix_is_spread_too():
    # JAX's testPinv1: pinv of a 2 x 400,000 matrix (each row is 1.6 MB).
    a = matrix((2, 400_000), seed=2)
    program = ipu_program(jnp.linalg.pinv, a)
    assert program.memory.fits
    assert_matches_cpu(jnp.linalg.pinv, a, **SCALED)


def test_small_batched_matrices_stay_whole_on_a_tile():
    program = ipu_program(jnp.linalg.cholesky, spd((64, 8, 8)))
    [step] = factorizations(program)
    assert step.compute_set.exchange is None
    assert len(step.compute_set.vertices) == 64


def test_a_matrix_too_large_for_the_whole_ipu_still_fails_clearly():
    small = get_target("ipu2", num_tiles=8)
    with pytest.raises(IpuOutOfMemoryError, match=r"out of memory on tile \d+ .* needs \d+ bytes"):
        ipu_program(jnp.linalg.inv, spd((828, 828)), target=small)
