"""The convolution vertices' cycle estimates against PopLibs' own
estimator formulas (graphcore/poplibs lib/poplin/PerformanceEstimation.hpp
at 7eac0f26; docs/ipu.md): each expected figure below is worked out by
hand from those functions for one small case, the arithmetic in the
comment, so that a change to compiler/cost_conv.py that departs from
PopLibs fails here."""
from __future__ import annotations

import numpy as np
import pytest

from jax_ipu.compiler import cost_conv
from jax_ipu.targets import get_target

IPU2 = get_target("ipu2")
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def test_amp_vertex_of_each_type():
    """getNumConvUnits on ipu2 (16 half/half, 8 half/float and float/float);
    weights per conv unit (4 loads of 64 bits: 16 halves, 8 floats); weight
    loads at half the ld128 rate (use128BitConvUnitLoad off):
    units x weight bytes per unit / 8."""
    hf = cost_conv.amp(IPU2, F16, F32)
    assert (hf.conv_units, hf.weights_per_unit, hf.weight_load_cycles) == (8, 16, 8 * 32 // 8)
    hh = cost_conv.amp(IPU2, F16, F16)
    assert (hh.conv_units, hh.weights_per_unit, hh.weight_load_cycles) == (16, 16, 16 * 32 // 8)
    ff = cost_conv.amp(IPU2, F32, F32)
    assert (ff.conv_units, ff.weights_per_unit, ff.weight_load_cycles) == (8, 8, 8 * 32 // 8)


@pytest.mark.parametrize("types,rows,width,want", [
    # getConvPartialnx1WorkerCycles, half/float, 8 units, worklist [5, 5]:
    # 17 + 2 x (3 + (34 + 2 x 4) - 9) = 89.
    ((F16, F32), 2, 5, 89),
    # float/float, worklist [1]: 17 + (3 + 33 - 9) = 44.
    ((F32, F32), 1, 1, 44),
    # half/half, 16 units (one more stride), worklist [2]: 17 + 1 + (3 + 33 + 1 - 9) = 46.
    ((F16, F16), 1, 2, 46),
    # half/float, worklist [3, 3, 3]: 17 + 3 x (3 + 34 - 9) = 101.
    ((F16, F32), 3, 3, 101),
])
def test_nx1_worker_cycles(types, rows, width, want):
    vertex = cost_conv.amp(IPU2, *types)
    got = cost_conv.nx1_worker_cycles(rows, width, vertex, workers=1)
    assert int(np.asarray(got).ravel()[0]) == want


def test_nx1_runs_are_cut_among_the_workers():
    """partitionConvPartialByWorker: 6 rows of 10 positions over 6 workers
    is a run of 10 each: 17 + (3 + 34 + 7 x 4 - 9) = 73 per worker."""
    vertex = cost_conv.amp(IPU2, F16, F32)
    got = np.asarray(cost_conv.nx1_worker_cycles(6, 10, vertex, workers=6))
    assert got.tolist() == [73] * 6


def test_one_by_one_cycles():
    """getConvPartial1x1SupervisorCycleEstimate, half/float (8 units, the
    common code path, retention savings (7, 3)), one conv group, 16 input
    and 8 output channels (one group each), 60 positions: a run of 10 per
    worker. Inner loop with zeroing: (37 + 7 x 4 - 7) x 6 = 348, the tag
    cost max(348, 348 + 14) = 362. Outer: 50 + 6 x (7 + 3 x 0)
    + (12 + 1) + (10 + 1 + (19 - 1 + (7 + 32 + 362))) = 535."""
    vertex = cost_conv.amp(IPU2, F16, F32)
    assert int(cost_conv.one_by_one_cycles(IPU2, vertex, 1, 16, 8, 60)) == 535


def test_zero_cycles():
    """getZeroSupervisorVertexCycleEstimate (float partials), 60 positions
    x 8 channels over 6 workers: 80 floats each, 40 vectors of 2:
    (40 + 14 - 9) x 6 workers x 1 group = 270."""
    assert int(cost_conv.zero_cycles(IPU2, 60, 1, 8)) == 270


def test_estimates_approach_the_amp_rate_from_above():
    """A large tile's ConvPartialnx1 (half/float: 8 conv units of 16
    weights each, 4 cycles per position) takes at least its multiply-adds
    at 8 x 16 / 4 = 32 a cycle, and within 30% of that (the
    overheads are per run, per kernel position and per group)."""
    vertex = cost_conv.amp(IPU2, F16, F32)
    rows, width, kh, kw, cin, cout = 24, 56, 3, 3, 16, 8
    cycles = int(cost_conv.nx1_cycles(IPU2, vertex, 1, cin, cout, rows, width, rows * width, kh, kw, 16))
    macs = rows * width * kh * kw * cin * cout
    assert macs / 32 <= cycles <= 1.3 * macs / 32
