"""Cycle estimates against IPU.md's measured figures.

AMP: tessellate-ipu's peak-flops notebook measured a per-tile fp16
[N,16]x[16,16] matmul with float16 accumulators on a Bow IPU (1472 tiles, 1.85 GHz) at 55.5, 211,
299.8 and 334.9 TFLOPS a chip for N = 16, 128, 512, 2048, which fits
cycles = 4N + 330 per tile.

A 2048x2048x2048 fp32 matmul on ipu2 (62.5 TFLOPS peak: 32 flops a cycle on
each of 1472 tiles at 1.33 GHz) is estimated at about 54% of peak. The
planner picks 8 row x 8 column x 16 K-chunk blocks, 1024 tiles (the split
limits are powers of two for rows and columns and divisors of K): each tile
does 256x128x256 multiply-adds in 524,288 AMP cycles (+330), after receiving
its two 128 KiB operand blocks (65,536 cycles at 4 B/cycle), then one sync
(sync_cycles) and the reduction of 16 fp32 partials per output (an exchange of
about 89,000 cycles). 2^34 flops / (~680,000 cycles x 32 x 1472) = 0.54:
the 30% of idle tiles and the exchanges cost the rest.
"""
from __future__ import annotations

import numpy as np
import pytest

from helpers import compile_fn
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.targets import get_target

MEASURED_BOW_TFLOPS = {16: 55.5, 128: 211.0, 512: 299.8, 2048: 334.9}


def _amp_cycles(target, rows: int) -> int:
    """The matmul compute set's cycles on a one-tile IPU, sync excluded
    (nothing is exchanged on one tile)."""
    a = np.ones((rows, 16), np.float16)
    b = np.ones((16, 16), np.float16)
    # float16 partials, as the measurement accumulated (its
    # preferred_element_type was the inputs' float16).
    program = compile_fn(lambda x, y: x @ y, a, b, target=target, partials_type="half")
    (step,) = [s for s in leaves(program.body)
               if isinstance(s, Execute) and s.compute_set.name.startswith("matmul ")
               and "reduce" not in s.compute_set.name]
    assert step.exchange_bytes == 0
    return step.cycles - target.sync_cycles


@pytest.mark.parametrize("rows", [16, 32, 64, 128, 256, 512, 1024, 2048])
def test_amp_fp16_per_tile_within_10_percent_of_4n_plus_330(rows):
    cycles = _amp_cycles(get_target("ipu21", num_tiles=1), rows)
    assert abs(cycles - (4 * rows + 330)) <= 0.1 * (4 * rows + 330)


@pytest.mark.parametrize("rows", sorted(MEASURED_BOW_TFLOPS))
def test_amp_fp16_matches_the_measured_bow_throughput(rows):
    bow = get_target("ipu21")
    flops_per_tile_cycle = MEASURED_BOW_TFLOPS[rows] * 1e12 / (bow.clock_hz * bow.num_tiles)
    measured_cycles = 2 * rows * 16 * 16 / flops_per_tile_cycle
    cycles = _amp_cycles(get_target("ipu21", num_tiles=1), rows)
    assert abs(cycles - measured_cycles) <= 0.1 * measured_cycles


def test_2048_cubed_fp32_matmul_on_ipu2_reaches_half_of_peak():
    ipu2 = get_target("ipu2")
    x = np.zeros((2048, 2048), np.float32)
    program = compile_fn(lambda a, b: a @ b, x, x, target=ipu2)
    peak = ipu2.fp32_flops_per_cycle * ipu2.num_tiles
    assert program.flops == 2 * 2048 ** 3
    utilisation = program.flops / (program.cycles * peak)
    assert 0.5 <= utilisation <= 1.0, utilisation
    seconds = program.cycles / ipu2.clock_hz
    assert program.flops / seconds / 1e12 >= 0.5 * 62.5 * 0.99   # TFLOPS, against the 62.5 a chip
