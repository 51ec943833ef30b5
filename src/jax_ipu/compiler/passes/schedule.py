"""Orders the program: argument streams in, the compute and exchange steps
in dependency order (as lowered, but for the in-place updates of donated
inputs, moved up to where their operands are ready), result streams out.
Also finds the step that writes and the last step that reads each tensor,
which the memory plan and in-place donation use."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.graph.compute import region_tensor_ids
from jax_ipu.graph.programs import (
    CONTROL,
    Copy,
    DeviceToHost,
    Execute,
    HostCall,
    HostToDevice,
    Sequence,
    StreamingCopy,
    leaves,
)
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.targets import Target


def reads(step) -> set[int]:
    if isinstance(step, Execute):
        return region_tensor_ids(step.compute_set.vertices, "reads")
    if isinstance(step, Copy):
        return {t.id for t in step.src.tensors}
    if isinstance(step, HostCall):
        return {t.id for v in step.inputs for t in v.tensors}
    if isinstance(step, StreamingCopy):
        starts = {s.tensor.id for s in step.starts if isinstance(s, View)}
        return starts | {step.tile.id if step.store else step.buffer.tensor.id}
    if isinstance(step, CONTROL):       # its sub-programs and predicate
        control = getattr(step, "predicate", None) or getattr(step, "control", None)
        return set().union({control.id} if control is not None else set(), *map(reads, leaves(step)))
    return set()


def writes(step) -> set[int]:
    if isinstance(step, Execute):
        return region_tensor_ids(step.compute_set.vertices, "writes")
    if isinstance(step, Copy):
        return {step.dst.id}
    if isinstance(step, HostCall):
        return {t.id for t in step.outputs}
    if isinstance(step, StreamingCopy):
        return {step.buffer.tensor.id if step.store else step.tile.id}
    if isinstance(step, CONTROL):
        return set().union(*map(writes, leaves(step)))
    return set()


def lifetimes(steps: list, num_tensors: int) -> tuple[np.ndarray, np.ndarray]:
    """(first step writing, last step reading) per tensor; -1 when none."""
    first = np.full(num_tensors, -1, dtype=np.int64)
    last = np.full(num_tensors, -1, dtype=np.int64)
    for i, step in enumerate(steps):
        for t in writes(step):
            if first[t] < 0:
                first[t] = i
        for t in reads(step):
            last[t] = i
    return first, last


def _updates_in_place(step, donors_of: dict[int, int], stored: set[int]) -> set[int] | None:
    """The donated inputs' tensor ids a fused element-wise step overwrites,
    if it writes nothing but outputs aliased to donated inputs that it reads
    itself (an optimiser's update of a parameter) or values moved to
    streaming memory (`stored`: an optimiser state kept there), else None."""
    if not (isinstance(step, Execute) and isinstance(step.compute_set.kernel, codelets.ElementwiseChain)):
        return None
    written = writes(step)
    if not written or not all(t in donors_of or t in stored for t in written):
        return None
    donors = {donors_of[t] for t in written if t in donors_of}
    return donors if donors <= reads(step) else None


def _moves(step) -> tuple[bool, bool]:
    """(a whole value loaded from streaming memory onto the tiles, one
    stored from the tiles to streaming memory)."""
    if not (isinstance(step, Copy) and isinstance(step.src, View)):
        return False, False
    return step.src.tensor.streaming and not step.dst.streaming, step.dst.streaming and not step.src.tensor.streaming


def hoist_updates(steps: list, received: list, inputs: list[Tensor], outputs: list[View],
                  aliases: dict[int, int]) -> tuple[list, list]:
    """(steps, received) with each in-place update of a donated input moved
    up to just after the last step it must follow: the last that writes a
    tensor it reads, or reads the input it overwrites.

    JAX emits a training step's optimiser updates after the whole backward
    pass, so every gradient stays live until the end: a large network's
    weight gradients are all live at the backward pass's peak. XLA
    schedules by liveness and runs each update once its gradient is ready;
    this does the same for these steps only. An update written in place
    into its parameter's memory (see in_place_outputs) takes no memory of
    its own, so moving it up frees its gradient early and costs nothing.
    An update of a value kept in streaming memory (the optimiser state
    offloaded) moves up with the load it alone reads and the stores of
    what it writes, so that the value is on the tiles only around it."""
    returned = [v.tensor.id for v in outputs]
    # The pairs in_place_outputs may accept (it also checks the order).
    donors_of = {outputs[o].tensor.id: inputs[i].id for o, i in aliases.items()
                 if outputs[o].is_whole_tensor and returned.count(outputs[o].tensor.id) == 1
                 and inputs[i].id not in returned and outputs[o].tensor.shape == inputs[i].shape
                 and outputs[o].tensor.dtype == inputs[i].dtype}
    if not donors_of:
        return steps, received
    order = list(range(len(steps)))
    read_sets = [reads(s) for s in steps]
    write_sets = [writes(s) for s in steps]
    moves = [_moves(s) for s in steps]
    stores = {}                 # tile tensor -> the steps storing it to streaming memory
    readers: dict[int, list] = {}
    for j, (_, store) in enumerate(moves):
        if store:
            stores.setdefault(steps[j].src.tensor.id, []).append(j)
        for t in read_sets[j]:
            readers.setdefault(t, []).append(j)
    # An update of a loaded value may also write what only one such update
    # reads (an offloaded optimiser's step, feeding the parameter's update).
    stored = set(stores)
    updates = {k for k, step in enumerate(steps) if _updates_in_place(step, donors_of, stored) is not None}
    feeding = {t for t, r in readers.items() if len(r) == 1 and r[0] in updates}
    stored_or_feeding = stored | feeding
    loaded = {steps[j].dst.id for j, (load, _) in enumerate(moves) if load}
    for k, step in enumerate(steps):
        donors = _updates_in_place(step, donors_of, stored_or_feeding if read_sets[k] & loaded else stored)
        if donors is None:
            continue
        at = order.index(k)
        needs, made = read_sets[k], write_sets[k]
        # Loads only this update reads, and the stores of what it writes, go with it.
        group = [j for j in order[:at] if moves[j][0] and write_sets[j] <= needs
                 and all(len(readers.get(t, ())) == 1 for t in write_sets[j])]
        group += [k] + [j for t in made for j in stores.get(t, ())]
        stop = at
        while stop > 0:
            j = order[stop - 1]
            if j not in group and (write_sets[j] & (needs | made) or read_sets[j] & (donors | made)):
                break
            stop -= 1
        anchor = next((j for j in order[stop:at] if j not in group), None)
        if anchor is not None:
            order = [j for j in order if j not in group]
            place = order.index(anchor)
            order[place:place] = sorted(group, key=lambda j: (not moves[j][0], moves[j][1]))
    return [steps[i] for i in order], [received[i] for i in order]


def schedule(target: Target, steps: list, inputs: list[Tensor], outputs: list[View]) -> tuple[Sequence, int]:
    """The program body and its host-transfer cycles."""
    per_byte = target.clock_hz / target.host_link_bytes_per_second
    streams_in = [HostToDevice(i, t, int(t.nbytes * per_byte)) for i, t in enumerate(inputs)]
    streams_out = [DeviceToHost(i, v, int(v.size * v.dtype.itemsize * per_byte)) for i, v in enumerate(outputs)]
    host = sum(s.cycles for s in streams_in + streams_out)
    return Sequence(streams_in + list(steps) + streams_out), host


def in_place_outputs(steps: list, inputs: list[Tensor], outputs: list[View], aliases: dict[int, int],
                     first: np.ndarray, last: np.ndarray) -> dict[int, int]:
    """Aliased outputs a fused element-wise step can write into the donated
    input's buffer: the input is read by no later step and is not a result."""
    written_by = {}
    for i, step in enumerate(steps):
        if isinstance(step, Execute) and isinstance(step.compute_set.kernel, codelets.ElementwiseChain):
            for _, t in step.compute_set.kernel.outputs:
                written_by[t.id] = i
    returned = [v.tensor.id for v in outputs]
    safe = {}
    for o, i in aliases.items():
        view, source = outputs[o], inputs[i]
        step = written_by.get(view.tensor.id)
        if (step is not None and view.is_whole_tensor and returned.count(view.tensor.id) == 1
                and source.id not in returned and last[source.id] <= step
                and view.tensor.shape == source.shape and view.tensor.dtype == source.dtype):
            safe[o] = i
    return safe
