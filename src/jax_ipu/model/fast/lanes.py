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

import numpy as np

from jax_ipu.graph import codelets

# Kernels a lane may hold: they read and write only the tensors they name.
LANE_KERNELS = (codelets.ElementwiseChain, codelets.MatMulPartials, codelets.ReduceCombine,
                 codelets.ReducePartials)
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


def work(kernel) -> float:
    """Rough host cost of a lane kernel, in element-operations."""
    if isinstance(kernel, codelets.MatMulPartials):
        batch, m, k = kernel.lhs.shape
        return batch * m * k * kernel.rhs.shape[-1] * MAC_COST
    if isinstance(kernel, codelets.ElementwiseChain):
        return float(np.prod(kernel.shape, dtype=np.float64)) * max(len(kernel.instructions), 1)
    if isinstance(kernel, codelets.ReducePartials):
        return float(np.prod(kernel.input.shape, dtype=np.float64))
    return float(np.prod(kernel.partials.shape, dtype=np.float64))


def _outputs(kernel) -> list:
    if isinstance(kernel, codelets.ElementwiseChain):
        return [t for _, t in kernel.outputs]
    return [kernel.out]


def units(steps: list, kernels: list, tensor_ids, aliases: dict) -> list:
    """The sequence's steps as Units, and as themselves where they are no
    lane kernel (barriers). kernels[i]: what the engine runs for steps[i]
    (None if no compute set); tensor_ids(obj, found) lists the tensors obj
    names; aliases: tensor -> tensors sharing its memory (donation)."""
    found = []
    i = 0
    while i < len(steps):
        kernel = kernels[i]
        if not isinstance(kernel, LANE_KERNELS):
            found.append(steps[i])
            i += 1
            continue
        group = [i]
        nxt = kernels[i + 1] if i + 1 < len(kernels) else None
        if (isinstance(kernel, codelets.MatMulPartials) and isinstance(nxt, codelets.ReduceCombine)
                and nxt.partials.tensor.id == kernel.out.id):
            group.append(i + 1)
        ks = [kernels[j] for j in group]
        writes = set()
        for k in ks:
            for t in _outputs(k):
                writes.add(t.id)
                writes |= aliases.get(t.id, set())
        reads = set(tensor_ids(ks, []))
        found.append(Unit([steps[j] for j in group], ks, reads, writes, sum(work(k) for k in ks)))
        i += len(group)
    return found


def _independent(a: Unit, b: Unit) -> bool:
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
    # (An MLP's updates: the helper's five ended 120 us after the caller's one.)
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
        elif all(_independent(u, g) for g in group):
            group.append(u)
        else:
            flush()
            group.append(u)
    flush()
    return items
