"""Independent compute sets side by side on the host's two cores.

A straight-line program often has compute sets next to each other that
share no tensor: a backward pass's input gradient and weight gradient
products, or the updates of every parameter. Rather than cutting each in
halves for the helper thread one after the other (a hand-off each, and
each half a smaller BLAS call), the engine runs such a group as two lanes,
one on the helper: fewer, larger calls and one hand-off. The IPU runs them
one compute set after another; the values are the same whichever thread
computes a compute set, and a lane's products are computed in whole row
blocks whether or not a helper takes the lane (decided by the program
alone, so the bits never depend on the load).

Only groups worth a hand-off, and balanced enough that two lanes beat one
big compute set cut in halves, become lanes."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from jax_ipu.graph import codelets, codelets_conv
from jax_ipu.graph.records import RECORDS, record_of
from jax_ipu.model.fast import helper

# Whether independent compute sets next to each other run as two lanes;
# off only to measure what that saves.
LANES = True
# Relative host cost, roughly: a float32 multiply-add of a planned product
# costs about 1/27 of an element of an element-wise op.
MAC_COST = 1 / 27
# A group of at least this much work (in element-operations; an SGD
# update of 256K parameters is 512K) is run as lanes...
MIN_GROUP_WORK = 1 << 18
# ... when its heavier lane holds at most this share of the work (else the
# big compute set keeps its halves).
MAX_LANE_SHARE = 0.65


@dataclasses.dataclass
class Unit:
    """Steps that go together: a compute set, or a product and the sum of
    its partials, with the kernels the engine runs for them."""
    steps: list
    kernels: list
    reads: set
    writes: set
    work: float


def _product_work(k: codelets.MatMulPartials) -> float:
    batch, m, kk = k.lhs.shape
    return batch * m * kk * k.rhs.shape[-1] * MAC_COST


# Rough host cost of each kind of kernel a lane may hold, in
# element-operations. A lane holds kernels whose records say they are
# pure (they read and write only the tensors they name) and whose cost is
# known here.
def _conv_work(k: codelets_conv.ConvPartials) -> float:
    chunks, groups, *positions, out_chans = k.out.shape
    depth = k.input.shape[2] * math.prod(size for size, *_ in k.window)
    return groups * math.prod(positions) * depth * out_chans * MAC_COST


WORK = {
    codelets.MatMulPartials: _product_work,
    codelets_conv.ConvPartials: _conv_work,
    codelets.ElementwiseChain: lambda k: float(np.prod(k.shape, dtype=np.float64)) * max(len(k.instructions), 1),
    codelets.ReducePartials: lambda k: float(np.prod(k.input.shape, dtype=np.float64)),
    codelets.ReduceCombine: lambda k: float(np.prod(k.partials.shape, dtype=np.float64)),
}


def in_lanes(kernel) -> bool:
    """Whether a lane may hold the kernel."""
    record = RECORDS.get(type(kernel))
    return record is not None and record.pure and type(kernel) in WORK


def work(kernel) -> float:
    """Rough host cost of a lane kernel, in element-operations."""
    return WORK[type(kernel)](kernel)


def _reads_stand_in_of(kernel, nxt) -> bool:
    """Whether `nxt` reads an output of `kernel` that may hold a stand-in
    (a product and the sum of its partials go together)."""
    if nxt is None or not in_lanes(nxt):
        return False
    held = {getattr(kernel, f.name).id for f in record_of(kernel).of_role("writes") if f.stand_in is not None}
    return bool(held) and any(t.id in held for t in record_of(nxt).read_tensors(nxt))


def units(steps: list, kernels: list, tensor_ids, aliases: dict) -> list:
    """The sequence's steps as Units, and as themselves where they are no
    lane kernel (barriers). kernels[i]: what the engine runs for steps[i]
    (None if no compute set); tensor_ids(obj, found) lists the tensors obj
    names; aliases: tensor -> tensors sharing its memory (donation)."""
    found = []
    i = 0
    while i < len(steps):
        kernel = kernels[i]
        if not in_lanes(kernel):
            found.append(steps[i])
            i += 1
            continue
        group = [i]
        nxt = kernels[i + 1] if i + 1 < len(kernels) else None
        if _reads_stand_in_of(kernel, nxt):
            group.append(i + 1)
        ks = [kernels[j] for j in group]
        writes = set()
        for k in ks:
            for t in record_of(k).written(k):
                writes.add(t.id)
                writes |= aliases.get(t.id, set())
        reads = set(tensor_ids(ks, []))
        found.append(Unit([steps[j] for j in group], ks, reads, writes, sum(work(k) for k in ks)))
        i += len(group)
    return found


def independent(a: Unit, b: Unit) -> bool:
    return not (a.writes & b.reads or b.writes & a.reads)


def _split(group: list) -> tuple[list, list] | None:
    """Two lanes of a group of independent units (heaviest first into the
    lighter lane), each in program order, or None when not worth it."""
    total = sum(u.work for u in group)
    if len(group) < 2 or total < MIN_GROUP_WORK:
        return None
    lanes, loads = ([], []), [0.0, 0.0]
    for u in sorted(group, key=lambda u: -u.work):
        lane = 0 if loads[0] <= loads[1] else 1
        lanes[lane].append(u)
        loads[lane] += u.work
    if max(loads) > MAX_LANE_SHARE * total:
        return None
    order = {id(u): i for i, u in enumerate(group)}
    first, second = (sorted(lane, key=lambda u: order[id(u)]) for lane in lanes)
    # The helper takes the lane of fewer units: a unit's Python holds the GIL,
    # which the helper waits for while the caller runs its own; with the
    # fewer, it soon spends its lane in BLAS or numpy calls, outside the GIL.
    return (second, first) if len(second) > len(first) else (first, second)


def plan(found: list) -> list:
    """The sequence as items: a Unit run where it stands, a barrier step,
    or a pair of lanes (lists of units)."""
    items, group = [], []

    def flush():
        split = _split(group)
        if split is None:
            items.extend(group)
        else:
            items.append(split)
        group.clear()
    for u in found:
        if not isinstance(u, Unit):
            flush()
            items.append(u)
        elif all(independent(u, g) for g in group):
            group.append(u)
        else:
            flush()
            group.append(u)
    flush()
    return items


def lanes_step(first: list, second: list, trace: list | None = None, infos: list = ()):
    """fn(state) running two lanes of step functions, the second on the
    helper thread when a core is free; `trace` (a traced run's record)
    gets `infos` first, the lanes' steps in program order."""
    def run(fns, state):
        for fn in fns:
            fn(state)

    def run_lanes(state):
        helper.run_lanes(lambda: run(first, state), lambda: run(second, state))
    if trace is not None:
        plain = run_lanes

        def run_lanes(state):
            trace.extend(infos)
            plain(state)
    run_lanes.shares = True
    return run_lanes
