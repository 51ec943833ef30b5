"""The convolution planner (after PopLibs' poplin): a convolution's conv
groups, batch, output field, input channels, output channels and kernel
positions partitioned over tiles, chosen by a cost model (cycles first)
among the partitions whose per-tile temporaries fit the share of a tile
that available_memory_proportion gives them.

Each tile receives the input region its outputs need (its field block,
with the halo its kernel block reaches) and its block of the kernel once,
and runs one AMP convolution vertex walking its kernel positions over
that region (cycles from PopLibs' estimators, compiler.cost_conv). Input
channels and kernel positions split over tiles give partial sums, which
a reduction across tiles adds up (ConvReduce).

When no partition's temporaries fit the budget, the convolution is split
serially over its output channels, as poplin's planner does (its
outChanSplit.serial, lib/poplin/ConvPlan.hpp at 7eac0f26): the same tiles
run `serial` steps one after another, each over a slice of the output
channels with the partition chosen for that slice, so that a step's input
regions, kernel blocks and partials are dead before the next step's are
made. Each step costs its own exchange, syncs, vertices and reduction
(poplin multiplies its per-step estimate by the serial split, ConvModel.cpp);
the steps' results are then copied into the output, one more exchange.

The AMP runs along one field dimension at a time (a worklist run is a
row of output positions with a fixed input stride). Rows run along the
innermost output dimension, or, where that is short and the batch is not
(the weight-update convolution of a backward pass: a 3x3 output field of
a "batch" of input channels), along the batch: the input then lies batch
innermost but for its channels, which may take a layout Copy first."""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from jax_ipu.compiler import cost, cost_conv
from jax_ipu.targets import Target


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """A convolution in poplin's terms, per conv group: `groups` groups of
    `batch` images of `in_chans` channels over the input field `in_sizes`,
    `out_chans` output channels over the output field `outs`, kernel
    `window`, with per spatial dimension the stride, padding (low, high;
    negative crops), input (lhs) and kernel (rhs) dilation."""
    groups: int
    batch: int
    in_chans: int
    out_chans: int
    in_sizes: tuple[int, ...]
    window: tuple[int, ...]
    outs: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    in_dtype: np.dtype
    partials_dtype: np.dtype
    out_dtype: np.dtype
    # Whether the input already lies batch-outer ([.., batch, field, chans])
    # and batch-inner ([.., field, batch, chans]): the other takes a Copy.
    batch_outer_in_place: bool = True
    batch_inner_in_place: bool = False

    @property
    def spatial(self) -> int:
        return len(self.outs)

    @property
    def macs(self) -> int:
        """Multiply-adds the convolution does (what reaches the input: a
        dilated input's holes and the padding excluded)."""
        per_dim = [len(_touching(n, w, s, p, ld, rd, o)) for n, w, s, p, ld, rd, o in zip(
            self.in_sizes, self.window, self.strides, self.pads, self.lhs_dilation, self.rhs_dilation, self.outs,
            strict=True)]
        return self.groups * self.batch * self.in_chans * self.out_chans * math.prod(per_dim)


def _touching(size, window, stride, pad, lhs_dil, rhs_dil, out) -> np.ndarray:
    """(output, kernel position) pairs of one axis that read an input
    element: [k, 2]."""
    o, k = np.meshgrid(np.arange(out), np.arange(window), indexing="ij")
    q = o * stride + k * rhs_dil - pad[0]
    inside = (q >= 0) & (q % lhs_dil == 0) & (q // lhs_dil < size)
    return np.stack([o[inside], k[inside]], axis=1)


@dataclasses.dataclass(frozen=True)
class ConvPlan:
    """Tiles along each partitioned axis, elements per tile (blocks; the
    last block of an axis may be smaller) and how the AMP runs."""
    groups: tuple[int, int]             # (tiles, block) along conv groups
    batch: tuple[int, int]
    outs: tuple[tuple[int, int], ...]   # per output spatial dimension
    in_chans: tuple[int, int]           # blocks divide the axis: equal chunks of partials
    out_chans: tuple[int, int]
    window: tuple[tuple[int, int], ...]  # per kernel spatial dimension; blocks divide it
    batch_inner: bool                   # AMP rows along the batch, not the innermost field dimension
    vertex: str                         # "nx1", "1x1" or "int" (no AMP)
    in_group: int                       # input channels per AMP group
    cycles: float
    temporary_bytes: int                # per tile: input region, kernel block and partials
    serial: int = 1                     # steps over output channels, each of out_chans' tiles and block
    in_serial: int = 1                  # steps over input channels, each of in_chans' tiles and block

    @property
    def tiles(self) -> int:
        return math.prod(s for s, _ in (self.groups, self.batch, *self.outs, self.in_chans, self.out_chans,
                                        *self.window))

    @property
    def chunks(self) -> int:
        """Partial sums per output element: input-channel and kernel splits."""
        return self.in_chans[0] * math.prod(s for s, _ in self.window)


def fits(plan: ConvPlan, target: Target, proportion: float) -> bool:
    return plan.temporary_bytes <= proportion * target.bytes_per_tile


def _powers(extent: int, limit: int) -> list[int]:
    """Tiles along an axis: powers of two below the extent, and the extent."""
    values = {1}
    p = 2
    while p < min(extent, limit + 1):
        values.add(p)
        p *= 2
    if extent <= limit:
        values.add(max(extent, 1))
    return sorted(values)


def _divisors(extent: int, limit: int) -> list[int]:
    return [d for d in range(1, min(extent, limit) + 1) if extent % d == 0] or [1]


def _candidates(axes: list, tiles: int) -> list[np.ndarray]:
    """Every combination of the axes' tile counts whose product is at most
    `tiles` and at least an eighth of the most any combination reaches
    (partitions leaving most of the IPU idle are no contenders; poplin
    spreads work over every tile it can): one array per axis."""
    combos = np.ones((1, 0), np.int64)
    product = np.ones(1, np.int64)
    for values in axes:
        values = np.asarray(values, np.int64)
        product = (product[:, None] * values[None, :]).ravel()
        combos = np.concatenate([np.repeat(combos, len(values), axis=0),
                                 np.tile(values, len(combos))[:, None]], axis=1)
        keep = product <= tiles
        combos, product = combos[keep], product[keep]
    keep = product * 8 >= product.max()
    return list(combos[keep].T)


def _blocks(extent: int, splits: np.ndarray) -> np.ndarray:
    return -(-extent // splits)


def _region(out_block, kernel_block, size, stride, lhs_dil, rhs_dil) -> np.ndarray:
    """Input elements along an axis a tile's output block and kernel block
    read (poplin's input range: the span of the dilated window over the
    strided outputs, in input elements, at most the axis)."""
    span = (out_block - 1) * stride + (kernel_block - 1) * rhs_dil + 1
    touched = np.minimum(span, out_block * kernel_block)      # strides past the window skip elements
    return np.minimum(-(-touched // lhs_dil), size)


# Serial splits tried: powers of two up to this many steps, over output
# channels and over input channels.
MAX_SERIAL = 64
MAX_IN_SERIAL = 64
# When no split fits: temporaries within 1 / SERIAL_GAIN of the least
# count as the least.
SERIAL_GAIN = 0.9


@functools.lru_cache(maxsize=4096)
def plan_conv(target: Target, problem: ConvProblem, proportion: float) -> ConvPlan:
    """The fastest partition whose temporaries fit `proportion` of a tile;
    when none does, the fastest serial split, over output channels or over
    input channels, whose steps fit (of each kind, doubling the steps up to
    the second that fits: a larger split may let a faster partition fit);
    when none of those does either, the plan with the least temporaries."""
    best = _plan_parallel(target, problem, proportion)
    if fits(best, target, proportion):
        return best
    plans = [best]
    for make, most in ((serial_plan, min(MAX_SERIAL, problem.out_chans)),
                       (in_serial_plan, min(MAX_IN_SERIAL, problem.in_chans))):
        tried = []
        serial = 2
        while serial <= most:
            tried.append(make(target, problem, proportion, serial))
            if len(tried) > 1 and fits(tried[-1], target, proportion) and fits(tried[-2], target, proportion):
                break
            serial *= 2
        plans += tried
    in_budget = [plan for plan in plans if fits(plan, target, proportion)]
    if in_budget:
        return min(in_budget, key=lambda plan: plan.cycles)
    # None fits: the fewest steps among those within SERIAL_GAIN of the
    # least temporaries (more steps cost their syncs for little: the
    # output's share and the input regions do not shrink with them).
    least = min(plan.temporary_bytes for plan in plans)
    return min((plan for plan in plans if plan.temporary_bytes * SERIAL_GAIN <= least),
               key=lambda plan: plan.serial * plan.in_serial)


def serial_output_bytes(target: Target, problem: ConvProblem) -> int:
    """Per tile, the output a serially split convolution copies its steps'
    results into (the steps' results, spread over the tiles, live beside
    it while it is copied)."""
    p = problem
    elements = p.groups * p.batch * math.prod(p.outs) * p.out_chans
    return -(-elements // target.num_tiles) * np.dtype(p.out_dtype).itemsize


def serial_plan(target: Target, problem: ConvProblem, proportion: float, serial: int) -> ConvPlan:
    """The plan of `serial` steps over slices of the output channels (the
    last may be smaller): each step's partition planned for its slice; the
    cycles those of every step plus the copy of their results into the
    output (an exchange of the output's share of a tile, and its sync); the
    temporaries a step's plus the output's share of a tile."""
    p = problem
    block = -(-p.out_chans // serial)
    steps = -(-p.out_chans // block)
    step = _plan_parallel(target, dataclasses.replace(p, out_chans=block), proportion, spread=False)
    out_bytes = serial_output_bytes(target, p)
    copy = target.exchange_fixed_cycles + target.sync_cycles + out_bytes / target.exchange_bytes_per_cycle
    return dataclasses.replace(step, cycles=steps * (step.cycles + serial_step_copy_cycles(target, p, block)) + copy,
                               temporary_bytes=step.temporary_bytes + out_bytes, serial=steps)


def serial_step_copy_cycles(target: Target, problem: ConvProblem, block: int) -> float:
    """A serial step's copies (compiler/lowering/conv.py): the slice of the
    kernel into the step's kernel tensor (an exchange, as poplin's dynamic
    slice of the weights in each iteration) and the step's result into a
    tensor of its own (on the tiles that hold it, as poplin's dynamic
    update of its output slice), each with its sync."""
    p = problem
    item = np.dtype(p.in_dtype).itemsize
    kernel = -(-p.groups * math.prod(p.window) * p.in_chans * block * item // target.num_tiles)
    result = -(-p.groups * p.batch * math.prod(p.outs) * block // target.num_tiles) * np.dtype(p.out_dtype).itemsize
    return (target.exchange_fixed_cycles + target.sync_cycles + kernel / target.exchange_bytes_per_cycle
            + target.sync_cycles + result / target.sram_write_bytes_per_cycle)


def in_serial_step(problem: ConvProblem, block: int) -> ConvProblem:
    """An input-channel serial step's convolution: `block` input channels,
    its result in the partials' type (the accumulator's: poplin casts only
    after the last step), read from a slice copied into the layout its
    partition wants (so never a layout Copy of its own)."""
    return dataclasses.replace(problem, in_chans=block, out_dtype=problem.partials_dtype,
                               batch_outer_in_place=True, batch_inner_in_place=True)


def in_serial_slice_bytes(target: Target, problem: ConvProblem, block: int) -> tuple[int, int]:
    """Per tile, the step's slices of the input and of the kernel (each a
    tensor of its own, spread over the tiles, live for all the steps)."""
    p = problem
    item = np.dtype(p.in_dtype).itemsize
    inputs = p.groups * p.batch * math.prod(p.in_sizes) * block * item
    kernel = p.groups * math.prod(p.window) * block * p.out_chans * item
    return -(-inputs // target.num_tiles), -(-kernel // target.num_tiles)


def in_serial_accumulator_bytes(target: Target, problem: ConvProblem) -> int:
    """Per tile, the accumulator of an input-channel serial split: the
    output's share of a tile in the partials' type (poplin's
    addInPlaceTempBytes, ConvModel.cpp)."""
    p = problem
    elements = p.groups * p.batch * math.prod(p.outs) * p.out_chans
    return -(-elements // target.num_tiles) * np.dtype(p.partials_dtype).itemsize


def in_serial_step_cycles(target: Target, problem: ConvProblem, block: int) -> float:
    """An input-channel serial step's work besides its convolution
    (compiler/lowering/conv.py): the input's and the kernel's slices
    copied in (two exchanges, each with its sync: poplin's dynamic slices
    of inputs and weights in each iteration), and the step's sum added into
    the accumulator (a compute set of the output's share of a tile:
    poplin's addInPlace, which it counts in every step)."""
    inputs, kernel = in_serial_slice_bytes(target, problem, block)
    per_tile_out = in_serial_accumulator_bytes(target, problem) // np.dtype(problem.partials_dtype).itemsize
    return (2 * (target.exchange_fixed_cycles + target.sync_cycles) + (inputs + kernel) / target.exchange_bytes_per_cycle
            + target.sync_cycles + cost.elementwise_cycles(target, per_tile_out, problem.partials_dtype, ["add"]))


def in_serial_final_cycles(target: Target, problem: ConvProblem) -> float:
    """After the last input-channel step: the accumulator cast to the
    output's type and spread to its linear mapping (an exchange of the
    accumulator's share of a tile, a sync and the cast: poplin's
    outputCastCycles, estimateCastCycles as cost_conv.reduce_cycles has it)."""
    p = problem
    acc = in_serial_accumulator_bytes(target, p)
    per_tile_out = acc // np.dtype(p.partials_dtype).itemsize
    cast = cost_conv.reduce_cycles(target, per_tile_out, 1, np.dtype(p.out_dtype).itemsize == 4,
                                   np.dtype(p.partials_dtype).itemsize == 4)
    return target.exchange_fixed_cycles + target.sync_cycles + acc / target.exchange_bytes_per_cycle + float(cast)


def in_serial_plan(target: Target, problem: ConvProblem, proportion: float, serial: int) -> ConvPlan:
    """The plan of `serial` steps over slices of the input channels (the
    last may be smaller): each step's partition planned for its slice
    (in_serial_step); the cycles those of every step and its slices and
    accumulation, plus the final cast; the temporaries a step's, the
    slices' and the accumulator's."""
    p = problem
    block = -(-p.in_chans // serial)
    steps = -(-p.in_chans // block)
    step = _plan_parallel(target, in_serial_step(p, block), proportion, spread=False)
    held = sum(in_serial_slice_bytes(target, p, block)) + in_serial_accumulator_bytes(target, p)
    cycles = steps * (step.cycles + in_serial_step_cycles(target, p, block)) + in_serial_final_cycles(target, p)
    return dataclasses.replace(step, cycles=cycles, temporary_bytes=step.temporary_bytes + held, in_serial=steps)


def _plan_parallel(target: Target, problem: ConvProblem, proportion: float, spread: bool = True) -> ConvPlan:
    """The fastest partition whose temporaries fit, or the one with the
    least; spread: a result that needs no reduction is copied from its
    vertices' tiles to the output's linear mapping (not a serial step's,
    whose results the steps' copy spreads)."""
    tiles = target.num_tiles
    p = problem
    axes = [_powers(p.groups, tiles), _powers(p.batch, tiles)]
    axes += [_powers(out, tiles) for out in p.outs]
    axes.append(_divisors(p.in_chans, tiles))
    axes.append(_powers(p.out_chans, tiles))
    axes += [_divisors(w, tiles) for w in p.window]
    flat = _candidates(axes, tiles)
    spatial = p.spatial
    g_s, n_s = flat[0], flat[1]
    o_s = flat[2:2 + spatial]
    ci_s, co_s = flat[2 + spatial], flat[3 + spatial]
    k_s = flat[4 + spatial:]
    best = None
    for batch_inner in ((False, True) if p.batch > 1 or not p.batch_outer_in_place else (False,)):
        for choice in _evaluate(target, p, proportion, g_s, n_s, o_s, ci_s, co_s, k_s, batch_inner, spread):
            if best is None or _better(choice, best, target, proportion):
                best = choice
    return best


def _better(a: ConvPlan, b: ConvPlan, target: Target, proportion: float) -> bool:
    fa, fb = fits(a, target, proportion), fits(b, target, proportion)
    if fa != fb:
        return fa
    if not fa:
        return a.temporary_bytes < b.temporary_bytes
    return a.cycles < b.cycles


def _evaluate(target: Target, p: ConvProblem, proportion: float, g_s, n_s, o_s, ci_s, co_s, k_s, batch_inner: bool,
              spread: bool = True):
    """The best candidate of each input-channel grouping (one for integer
    convolutions), as ConvPlans."""
    item = np.dtype(p.in_dtype).itemsize
    acc = np.dtype(p.partials_dtype).itemsize
    g_b, n_b = _blocks(p.groups, g_s), _blocks(p.batch, n_s)
    o_b = [_blocks(out, s) for out, s in zip(p.outs, o_s, strict=True)]
    ci_b, co_b = p.in_chans // ci_s, _blocks(p.out_chans, co_s)
    k_b = [w // s for w, s in zip(p.window, k_s, strict=True)]
    regions = [_region(ob, kb, n, s, ld, rd) for ob, kb, n, s, ld, rd in zip(
        o_b, k_b, p.in_sizes, p.strides, p.lhs_dilation, p.rhs_dilation, strict=True)]
    in_bytes = g_b * n_b * math.prod(regions) * ci_b * item
    w_bytes = g_b * math.prod(k_b) * ci_b * co_b * item
    positions = math.prod(o_b)
    partial_bytes = g_b * n_b * positions * co_b * acc
    # What a convolution reads and keeps while it runs: the exchanged input
    # region and kernel block, and the partials it accumulates into.
    temporary = in_bytes + w_bytes + partial_bytes
    exchange = target.exchange_fixed_cycles + (in_bytes + w_bytes) / target.exchange_bytes_per_cycle
    chunks = ci_s * math.prod(k_s)
    out_elements = p.groups * p.batch * math.prod(p.outs) * p.out_chans
    per_tile_out = -(-out_elements // target.num_tiles)
    out_float = np.dtype(p.out_dtype).itemsize == 4
    partials_float = acc == 4
    needs_reduce = (chunks > 1) | (np.dtype(p.partials_dtype) != np.dtype(p.out_dtype))
    reduce_compute = cost_conv.reduce_cycles(target, per_tile_out, chunks, out_float, partials_float)
    # Without a reduction, the partials are the result: copied from the
    # vertices' tiles to the output's (compiler/lowering/conv.py).
    spreading = (target.exchange_fixed_cycles + target.sync_cycles
                 + per_tile_out * np.dtype(p.out_dtype).itemsize / target.exchange_bytes_per_cycle) if spread else 0
    reduction = np.where(needs_reduce, target.exchange_fixed_cycles + target.sync_cycles
                         + per_tile_out * chunks * acc / target.exchange_bytes_per_cycle + reduce_compute, spreading)
    layout_copy = 0.0
    if (batch_inner and not p.batch_inner_in_place) or (not batch_inner and not p.batch_outer_in_place):
        in_size = p.groups * p.batch * math.prod(p.in_sizes) * p.in_chans * item
        layout_copy = (target.exchange_fixed_cycles + target.sync_cycles
                       + -(-in_size // target.num_tiles) / target.exchange_bytes_per_cycle)
        temporary = temporary + -(-in_size // target.num_tiles)
    base = exchange + target.sync_cycles + reduction + layout_copy
    if np.dtype(p.in_dtype).kind != "f":
        kinds = [("int", 1)]
    else:
        vertex = cost_conv.amp(target, p.in_dtype, p.partials_dtype)
        one_by_one = all(w == 1 for w in p.window) and all(s == ld == 1 for s, ld in zip(
            p.strides, p.lhs_dilation, strict=True)) and all(lo == hi == 0 for lo, hi in p.pads)
        kinds = [("1x1" if one_by_one and group == vertex.weights_per_unit else "nx1", group)
                 for group in cost_conv.in_chans_groups(vertex)]
    for kind, group in kinds:
        compute = compute_cycles(target, kind, group, batch_inner, p.in_dtype, p.partials_dtype, p.strides,
                                 p.lhs_dilation, g_b, n_b, o_b, ci_b, co_b, k_b)
        yield _choice(p, g_s, n_s, o_s, ci_s, co_s, k_s, g_b, n_b, o_b, ci_b, co_b, k_b, batch_inner, kind, group,
                      base + compute, temporary, target, proportion)


def compute_cycles(target: Target, kind: str, group: int, batch_inner: bool, in_dtype, partials_dtype, strides,
                   lhs_dilation, g_b, n_b, o_b, ci_b, co_b, k_b):
    """A tile's convolution vertex's cycles for its blocks' sizes (numbers
    or arrays; o_b and k_b per spatial dimension): `kind` "nx1", "1x1" or
    "int", input channels in AMP groups of `group`."""
    positions = functools.reduce(np.multiply, o_b, 1)
    kernel_positions = functools.reduce(np.multiply, k_b, 1)
    if kind == "int":
        return target.supervisor_cycles + g_b * n_b * positions * ci_b * co_b * kernel_positions
    vertex = cost_conv.amp(target, in_dtype, partials_dtype)
    padded_in = -(-np.asarray(ci_b) // group) * group
    if kind == "1x1":
        return cost_conv.one_by_one_cycles(target, vertex, g_b, padded_in, co_b, n_b * positions)
    # Output positions a kernel position contributes to (a dilated input's
    # holes skipped), as the AMP's worklists cover them.
    out_strides = [ld // math.gcd(ld, s) for ld, s in zip(lhs_dilation, strides, strict=True)]
    active = [-(-np.asarray(ob) // os) for ob, os in zip(o_b, out_strides, strict=True)]
    if batch_inner:
        rows, width = functools.reduce(np.multiply, active, 1), n_b
    else:
        rows, width = n_b * functools.reduce(np.multiply, active[:-1], 1), active[-1]
    height = vertex.weights_per_unit // group
    outer = -(-np.asarray(k_b[0]) // height)
    inner = kernel_positions // np.asarray(k_b[0])
    return cost_conv.nx1_cycles(target, vertex, g_b, padded_in, co_b, rows, width, n_b * positions, outer, inner,
                                group)


def _choice(p, g_s, n_s, o_s, ci_s, co_s, k_s, g_b, n_b, o_b, ci_b, co_b, k_b, batch_inner, kind, group, cycles,
            temporary, target, proportion) -> ConvPlan:
    cycles = np.broadcast_to(np.asarray(cycles, np.float64), np.shape(g_s))
    temporary = np.broadcast_to(np.asarray(temporary), np.shape(g_s))
    in_budget = temporary <= proportion * target.bytes_per_tile
    i = int(np.argmin(np.where(in_budget, cycles, np.inf))) if in_budget.any() else int(np.argmin(temporary))

    def at(x):
        return int(np.broadcast_to(x, np.shape(g_s))[i])
    return ConvPlan((at(g_s), at(g_b)), (at(n_s), at(n_b)),
                    tuple((at(s), at(b)) for s, b in zip(o_s, o_b, strict=True)),
                    (at(ci_s), at(ci_b)), (at(co_s), at(co_b)),
                    tuple((at(s), at(b)) for s, b in zip(k_s, k_b, strict=True)),
                    batch_inner, kind, group, float(cycles[i]), at(temporary))
