"""Cycle estimates of the convolution vertices, as PopLibs' own estimators
compute them (graphcore/poplibs lib/poplin/PerformanceEstimation.hpp and
lib/poplin/ConvUtilInternal.cpp at 7eac0f26, 2023-08-11; docs/ipu.md):

- ConvPartialnx1 (the AMP walking kernel positions, with worklists of
  runs of output positions per worker), plus the zeroing of its partials;
- ConvPartial1x1Out (one kernel position, the field a single run);
- ConvReduce (partials summed across tiles) and the cast of a result that
  needs no reduction.

Every function takes numpy arrays (or numbers) of a tile's sizes, so that
the planner costs all its candidates at once and the lowering every
vertex of a plan with the same code. Integers have no AMP: one
multiply-add a cycle, as compiler.cost.matmul_cycles charges them."""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_ipu.targets import Target

# PopLibs' data path width (the tile's 64-bit loads), in bits.
DATA_PATH_BITS = 64


@dataclasses.dataclass(frozen=True)
class AmpVertex:
    """How a tile's AMP runs a convolution of one (input, partials) type."""
    conv_units: int            # output channels a pass accumulates
    weights_per_unit: int      # input channels a conv unit holds (16 float16, 8 float32)
    float_acts: bool
    float_partials: bool
    weight_load_cycles: int    # per pass: the conv units' weights loaded

    @property
    def core_cycles(self) -> int:
        """Cycles per output position of a worklist run."""
        return 8 if self.float_acts else 4


def amp(target: Target, in_dtype: np.dtype, partials_dtype: np.dtype) -> AmpVertex:
    in_dtype, partials_dtype = np.dtype(in_dtype), np.dtype(partials_dtype)
    units = target.conv_units(in_dtype, partials_dtype)
    weights = target.conv_unit_chain_length * target.conv_input_load_bytes // in_dtype.itemsize
    # PopLibs loads weights 64 bits a cycle unless use128BitConvUnitLoad
    # is set (it is not by default): the target's ld128 rate halved.
    coeff = max(target.conv_coeff_load_bytes_per_cycle // 2, 1)
    return AmpVertex(units, weights, in_dtype.itemsize == 4, partials_dtype.itemsize == 4,
                     units * weights * in_dtype.itemsize // coeff)


def in_chans_groups(vertex: AmpVertex) -> tuple[int, ...]:
    """The input-channel groupings the AMP vertices take (PopLibs' AMP
    vertex types): all of a conv unit's weights, or a half or a quarter of
    them, the unit then holding 2 or 4 kernel rows (the filter height)."""
    full = vertex.weights_per_unit
    return full, full // 2, full // 4


def _worker_runs(rows, width, workers: int):
    """PopLibs' partitionConvPartialByWorker, in closed form: `rows` runs
    of `width` output positions each (batch x outer field rows, the
    innermost field dimension) cut into `workers` equal ranges of
    positions. Per worker [..., w]: its number of runs, the lengths of its
    first and last run (equal when it has one) and of the runs between."""
    rows, width = np.asarray(rows, np.int64), np.asarray(width, np.int64)
    total = rows * width
    w = np.arange(workers)
    begin = (w * total[..., None]) // workers
    end = ((w + 1) * total[..., None]) // workers
    width = np.maximum(width[..., None], 1)
    empty = end <= begin
    first_row, last_row = begin // width, (end - 1) // width
    runs = np.where(empty, 0, last_row - first_row + 1)
    single = runs == 1
    first = np.where(single, end - begin, width - begin % width)
    last = np.where(single, end - begin, (end - 1) % width + 1)
    return runs, np.where(empty, 0, first), np.where(empty, 0, last), width


def _nx1_run_cycles(n, vertex: AmpVertex):
    """A worker's cycles for one worklist run of n output positions
    (getConvPartialnx1WorkerCycles' switch, half or float activations)."""
    n = np.asarray(n, np.int64)
    extra = int(not vertex.float_acts and ((not vertex.float_partials and vertex.conv_units == 16)
                                           or (vertex.float_partials and vertex.conv_units == 8)))
    if vertex.float_acts:
        return np.select([n == 0, n == 1, n == 2], [17, 33, 44], 45 + (n - 3) * vertex.core_cycles)
    return np.select([n == 0, n == 1, n == 2], [17, 29, 33 + extra], 34 + (n - 3) * vertex.core_cycles)


# A worklist run's fixed cycles besides its switch (the second tripack
# pointer and stride), less what retained worker state saves.
NX1_RUN_OVERHEAD = 3
NX1_RETENTION_SAVINGS = 9


def nx1_worker_cycles(rows, width, vertex: AmpVertex, workers: int):
    """[..., workers]: each worker's cycles for one kernel position."""
    runs, first, last, width = _worker_runs(rows, width, workers)
    middle = np.maximum(runs - 2, 0)
    per_run = NX1_RUN_OVERHEAD - NX1_RETENTION_SAVINGS
    cycles = (17 + (0 if vertex.float_partials else 1)
              + np.where(runs >= 1, _nx1_run_cycles(first, vertex) + per_run, 0)
              + np.where(runs >= 2, _nx1_run_cycles(last, vertex) + per_run, 0)
              + middle * (_nx1_run_cycles(width, vertex) + per_run))
    return cycles


def nx1_cycles(target: Target, vertex: AmpVertex, conv_groups, in_chans, out_chans, rows, width, zero_positions,
               kernel_outer, kernel_inner, in_group):
    """A tile's ConvPartialnx1 (getConvPartialnx1SupervisorCycleEstimate's
    half/float path) plus the zeroing of its partials
    (estimateZeroSupervisorCycles). rows x width: the worker-partitioned
    output positions a kernel position contributes to (only those a
    dilated input reaches); zero_positions: every output position of the
    tile (batch x field); kernel_outer, kernel_inner: the kernel positions
    the vertex walks (outer: rows of the kernel, taken filter-height at a
    time); in_group: input channels per group (in_chans_per_group)."""
    workers = target.workers_per_tile
    in_group = np.asarray(in_group, np.int64)
    filter_height = vertex.weights_per_unit // in_group
    out_group = vertex.conv_units
    in_groups = -(-np.asarray(in_chans, np.int64) // in_group)
    out_groups = -(-np.asarray(out_chans, np.int64) // out_group)
    passes = 1                                        # output channels per group / conv units
    innermost = (vertex.weight_load_cycles + np.select([filter_height == 4, filter_height == 2, filter_height == 1],
                                                       [60, 46, 15], 20 * filter_height) + 3)
    per_worker = nx1_worker_cycles(rows, width, vertex, workers)
    kernel_loop = np.maximum(workers * per_worker.max(axis=-1), workers * per_worker.min(axis=-1) + 9) * passes
    kernel_outer, kernel_inner = np.asarray(kernel_outer, np.int64), np.asarray(kernel_inner, np.int64)
    inner = (kernel_outer * (14 + kernel_inner * (17 - 5 + passes * innermost))
             + kernel_outer * kernel_inner * kernel_loop)
    g = np.asarray(conv_groups, np.int64)
    outer = (109 + workers * NX1_RETENTION_SAVINGS + workers * (9 if vertex.float_partials else 10)
             + g * (out_groups * 17 + (out_groups - 1) * 6 + 1) + (g - 1) * 6 + 1
             + g * (16 + in_groups * (14 + out_groups * (14 + inner))))
    return outer + zero_cycles(target, zero_positions, out_groups * g, out_group)


def zero_cycles(target: Target, positions, groups, out_group: int):
    """Zeroing a tile's float partials before the AMP accumulates into
    them (getZeroSupervisorVertexCycleEstimate, as the planner calls it)."""
    workers = target.workers_per_tile
    per_worker = -(-np.asarray(positions, np.int64) * out_group // workers)
    vector = DATA_PATH_BITS // 32
    return (-(-per_worker // vector) + 14 - 9) * groups * workers     # 9: retained state (float partials)


def _one_by_one_run_cycles(n, vertex: AmpVertex, zeroing: bool):
    """A worker's cycles for its one run of n positions
    (getConvPartial1x1SupervisorInnerLoopCycleEstimateHalfFloat), before
    retention savings; 0 for no run."""
    n = np.asarray(n, np.int64)
    z = int(zeroing)
    core = vertex.core_cycles
    if vertex.float_acts:
        zpg = 8 if vertex.conv_units == 16 else 4
        values = [47 + (2 + zpg) * z, 46 + (2 + zpg * 2) * z]
        rest = 46 + (2 + zpg * n) * z + (n - 3) * core
        return np.select([n == 0, n == 1, n == 2], [0, *values], rest)
    common = vertex.conv_units == 16 or vertex.float_partials
    if common:
        tail = 1 if zeroing else 2
        return np.select([n == 0, n == 1, n == 2], [0, 31 + tail, 40 + tail],
                         (37 if zeroing else 38) + (n - 3) * core)
    zpg = 4 if vertex.float_partials else 2
    return np.select([n == 0, n == 1, n == 2], [0, 39 + (2 + zpg) * z, 40 + (2 + zpg * 2) * z],
                     41 + (2 + zpg * n) * z + (n - 3) * core)


def _one_by_one_retention(vertex: AmpVertex) -> tuple[int, int]:
    if not vertex.float_acts and (vertex.float_partials or vertex.conv_units == 16):
        return 7, 3
    return 0, 0


def one_by_one_cycles(target: Target, vertex: AmpVertex, conv_groups, in_chans, out_chans, positions):
    """A tile's ConvPartial1x1Out (getConvPartial1x1SupervisorCycleEstimate's
    half/float path): one kernel position, `positions` output positions
    (the field flattened) cut into one run per worker."""
    workers = target.workers_per_tile
    # Each worker's single run: the positions of its range.
    positions = np.asarray(positions, np.int64)
    w = np.arange(workers)
    n = ((w + 1) * positions[..., None]) // workers - (w * positions[..., None]) // workers
    retention = _one_by_one_retention(vertex)

    def inner(zeroing: bool):
        per = np.where(n > 0, _one_by_one_run_cycles(n, vertex, zeroing) - retention[0], 0)
        return np.maximum(workers * per.max(axis=-1), workers * per.min(axis=-1) + 14)
    with_zero, without_zero = inner(True), inner(False)
    in_groups = -(-np.asarray(in_chans, np.int64) // vertex.weights_per_unit)
    out_groups = -(-np.asarray(out_chans, np.int64) // vertex.conv_units)
    g = np.asarray(conv_groups, np.int64)
    cp = int((not vertex.float_acts and vertex.conv_units == 16) or vertex.float_partials)
    passes = 1
    loads = vertex.weight_load_cycles
    return (50 + workers * (retention[0] + retention[1] * (in_groups * g - 1))
            + g * (12 + cp + (in_groups - 1) * (15 - cp + 1 + out_groups * (19 + passes * (6 + loads + without_zero)))
                   + (10 + 1 + out_groups * (19 - cp + passes * (7 + loads + with_zero)))))


def reduce_cycles(target: Target, outputs, depth, out_float: bool, partials_float: bool):
    """A tile summing `depth` partials of each of its `outputs` elements
    (getReduceCycleEstimate, the supervisor vertex reading several
    inputs), or, for a depth of 1 whose type changes, the cast
    (estimateCastCycles); 0 for nothing to do."""
    workers = target.workers_per_tile
    outputs, depth = np.asarray(outputs, np.int64), np.asarray(depth, np.int64)
    acc = 4 if partials_float else 8
    in_path = DATA_PATH_BITS // (32 if partials_float else 16)
    per_loop = acc // min(acc, in_path) + 1
    loops = outputs // acc
    for bit in range(int(np.log2(acc))):
        loops = loops + ((outputs >> bit) & 1)
    shared = loops // workers
    partial_width = (outputs & (acc - 1)) != 0
    leftover = (loops % workers) != 0
    cycles = 32 + np.where(leftover & partial_width, 2 * depth + (13 if partials_float else 11), 0)
    shared = shared + (leftover & ~partial_width)
    tail = (7 if partials_float else 9) if out_float else (6 if partials_float else 8)
    reduced = (cycles + (per_loop * depth + tail) * shared) * workers
    # A single partial cast to the output type (float partials, half output).
    per_worker = -(-outputs // workers)
    vector = DATA_PATH_BITS // (32 if partials_float else 16)
    out_vector = DATA_PATH_BITS // (32 if out_float else 16)
    cast = (np.maximum(-(-per_worker // vector), -(-per_worker // out_vector)) + 26) * workers
    cast = np.where(out_float == partials_float, 0, cast)
    return np.where(outputs == 0, 0, np.where(depth > 1, reduced, cast))
