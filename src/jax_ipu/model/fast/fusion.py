"""Where a fusion (model/registry.py) may leave its stand-in: the outputs
of its producers that no step reads but its consumers (through the field
the fusion names, and accepting the kernel), that are no input or output
of the program and decide no control flow. Their buffers are then the
producer's own from run to run (MatMulPartials' partials: the sum over
the chunks, made row block by row block while in cache)."""
from __future__ import annotations

from jax_ipu.graph import programs as p
from jax_ipu.graph.program import Program
from jax_ipu.graph.records import RECORDS, tensor_ids
from jax_ipu.model.registry import FUSIONS


def stand_ins(program: Program) -> frozenset:
    """Ids of the tensors that hold a fusion's stand-in in this program."""
    if not FUSIONS:
        return frozenset()
    held, other = set(), []
    for step in p.leaves(program.body):
        kernel = step.compute_set.kernel if isinstance(step, p.Execute) else step
        record = RECORDS.get(type(kernel))
        produced = FUSIONS.get(type(kernel))
        consumed = next((f for f in FUSIONS.values() if type(kernel) is f.consumer and f.accepts(kernel)), None)
        if produced is not None:
            held.add(getattr(kernel, produced.field).id)
            other += [t.id for t in record.tensors(kernel, without=produced.field)]
        elif consumed is not None:
            other += [t.id for t in record.tensors(kernel, without=consumed.reads)]
        else:
            tensor_ids(kernel, other)
    if not held:
        return frozenset()
    for step in _controls(program.body):
        tensor_ids([getattr(step, f) for f in ("predicate", "control") if hasattr(step, f)], other)
    tensor_ids(program.outputs, other)
    tensor_ids(program.inputs, other)
    return frozenset(held - set(other))


def _controls(step):
    if isinstance(step, p.CONTROL):
        yield step
        for child in p.children(step):
            yield from _controls(child)
