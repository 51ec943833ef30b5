"""Copies the engine need not make on the host: a layout change
(transpose, broadcast, slice...) whose destination is read, later in the
same sequence, only by kernels whose records say they read views alone
(element-wise chains, matmul operands) or by Copies, while nothing writes
its source. Those readers read the source through the composed view
instead, as Poplar's vertices read rearranged elements straight from
exchange: the same values, the planned exchange and cycles unchanged, one
host copy fewer."""
from __future__ import annotations

import bisect
import collections
import dataclasses

from jax_ipu.graph import programs as p
from jax_ipu.graph.program import Program
from jax_ipu.graph.records import RECORDS, record_of, tensor_ids
from jax_ipu.graph.views import REARRANGING, Concat, View

# Whether the engine skips such Copies; off only to measure what that saves.
LAZY_COPIES = True


def compose(view, lazy: dict):
    """`view` of a lazy Copy's destination as a view of the Copy's source."""
    if isinstance(view, Concat):
        return Concat(tuple(compose(part, lazy) for part in view.parts), view.axis)
    src = lazy.get(view.tensor.id)
    if src is None:
        return view
    ops = src.ops if src.shape == view.tensor.shape else src.ops + (("reshape", view.tensor.shape),)
    return View(src.tensor, ops + view.ops)


def redirectable(kernel) -> bool:
    """Whether the kernel's reads may be redirected to lazy Copies' sources."""
    record = RECORDS.get(type(kernel))
    return record is not None and record.reads_through_views


def redirected(kernel, lazy: dict):
    """The kernel reading lazy Copies' sources instead of their destinations."""
    changes = {}
    for field in record_of(kernel).of_role("reads"):
        value = getattr(kernel, field.name)
        if isinstance(value, tuple):
            changes[field.name] = tuple(compose(v, lazy) if isinstance(v, View) else v for v in value)
        elif isinstance(value, View):
            changes[field.name] = compose(value, lazy)
    return dataclasses.replace(kernel, **changes)


def _read_views(step) -> list | None:
    """The views a step reads through the engine's readers, or None when
    the step is not one whose reads may be redirected (it may also read
    tensors otherwise, or write in place)."""
    if isinstance(step, p.Copy):
        return [step.src] if isinstance(step.src, View) else None
    if isinstance(step, p.Execute) and redirectable(step.compute_set.kernel):
        return record_of(step.compute_set.kernel).views(step.compute_set.kernel)
    return None


def _written(step) -> set | None:
    """Tensors a redirectable step writes (None: any it refers to)."""
    if isinstance(step, p.Copy):
        return {step.dst.id}
    if isinstance(step, p.Execute) and redirectable(step.compute_set.kernel):
        return {t.id for t in record_of(step.compute_set.kernel).written(step.compute_set.kernel)}
    return None


def refs(step, found: list) -> list:
    """Ids of the tensors a step's kernels (not its vertices' regions)
    refer to, once per mention; control steps with their bodies."""
    if isinstance(step, p.CONTROL):
        tensor_ids([getattr(step, f) for f in ("predicate", "control") if hasattr(step, f)], found)
        for child in p.children(step):
            refs(child, found)
    elif isinstance(step, p.Execute):
        tensor_ids(step.compute_set.kernel, found)
    else:
        tensor_ids(step, found)
    return found


def donation_aliases(program: Program) -> collections.defaultdict:
    """{tensor id: ids of the tensors sharing its memory}: a donated input's
    memory is also its output's, so writes to either count for both."""
    aliases = collections.defaultdict(set)
    for o, i in program.in_place.items():
        aliases[program.inputs[i].id].add(program.outputs[o].tensor.id)
        aliases[program.outputs[o].tensor.id].add(program.inputs[i].id)
    return aliases


def lazy_copies(program: Program) -> dict:
    """{destination tensor id: source view} of the Copies the engine need
    not make on the host (see the module's docstring)."""
    counts = collections.Counter(tensor_ids(program.outputs, []))
    counts.update(tensor_ids(program.inputs, []))
    counts.update(refs(program.body, []))
    aliases = donation_aliases(program)
    lazy: dict = {}

    def sequence(steps) -> None:
        # Where each tensor is read through views, and written, in this
        # sequence (positions ascending, a read once per view): each Copy
        # then finds its readers and hazards by bisection, not by scanning
        # every later step (quadratic in long unrolled programs).
        read_at: dict[int, list] = collections.defaultdict(list)
        written_at: dict[int, list] = collections.defaultdict(list)
        for j, step in enumerate(steps):
            for v in _read_views(step) or ():
                read_at[v.tensor.id].append(j)
            found = _written(step)
            for t in (found if found is not None else set(refs(step, []))):
                written_at[t].append(j)

        def written_between(t: int, i: int, last: int) -> bool:
            """Whether a step in (i, last] writes tensor t."""
            at = written_at.get(t, ())
            return bisect.bisect_right(at, i) < bisect.bisect_right(at, last)

        for i, step in enumerate(steps):
            if isinstance(step, p.CONTROL):
                if isinstance(step, p.Sequence):
                    sequence(step.steps)
                else:
                    for child in p.children(step):
                        sequence(child.steps)
                continue
            if not isinstance(step, p.Copy) or not isinstance(step.src, View) or step.src.is_whole_tensor:
                continue
            d, src = step.dst.id, compose(step.src, lazy)
            if src.tensor.id == d:
                continue
            at = read_at.get(d, ())
            readers = len(at) - bisect.bisect_right(at, i)
            # Every other mention of the destination is one of these reads.
            if not readers or counts[d] != 1 + readers:
                continue
            if any(op[0] in REARRANGING for op in src.ops) and readers > 1:
                continue       # gathered (or windowed) once, not once per reader
            sources = {src.tensor.id} | aliases[src.tensor.id]
            if not any(written_between(t, i, at[-1]) for t in sources):
                lazy[d] = src

    sequence(program.body.steps)
    return lazy


def shared_copies(program: Program) -> frozenset:
    """Ids of the destinations of whole-tensor Copies (a loop's carried
    value made from an argument, say) that may share their source's array:
    nothing but the Copy writes the destination, nothing writes the source
    (an argument or a constant), and neither shares memory with another
    tensor (a donated argument and its output). Their readers read the
    same values; the Program's exchange and cycles are unchanged."""
    writers = collections.Counter()
    copies = []
    for step in p.leaves(program.body):
        if isinstance(step, p.Execute):
            writers.update(t.id for t in record_of(step.compute_set.kernel).written(step.compute_set.kernel))
        elif isinstance(step, p.Copy):
            writers[step.dst.id] += 1
            if isinstance(step.src, View) and step.src.is_whole_tensor and step.src.dtype == step.dst.dtype:
                copies.append(step)
        elif isinstance(step, p.HostCall):
            writers.update(t.id for t in step.outputs)
    aliases = donation_aliases(program)
    return frozenset(step.dst.id for step in copies
                     if writers[step.dst.id] == 1 and not writers[step.src.tensor.id]
                     and not aliases[step.dst.id] and not aliases[step.src.tensor.id])
