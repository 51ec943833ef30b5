"""Control flow: optimization_barrier (an identity that fusion does not
cross); while -> Repeat when its trip count is known at compile
time (fori_loop and scan: a counter from a constant, below a constant, by
one), else RepeatWhileTrue; if -> If, case -> Switch. The loop runs on the
device: each loop-carried value has one fixed tensor, the
condition region computes a scalar predicate tensor, and the body region's
results are copied back into the carried tensors every iteration. Branch
results are copied into one output tensor per result. Regions are fused
and lowered like the function body, their steps collected into the
control step's sub-programs."""
from __future__ import annotations

import contextlib

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.builder import Builder, Lowered, Splat
from jax_ipu.compiler.lowering.layout import copy_to_new, name_of
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.compiler.passes import streaming
from jax_ipu.compiler.passes.fuse import fuse
from jax_ipu.compiler.passes.legalize import FlatFunction
from jax_ipu.compiler.passes.lower import lower
from jax_ipu.graph.programs import If, Repeat, RepeatWhileTrue, Sequence, Switch
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View


@contextlib.contextmanager
def collecting(b: Builder):
    """Steps emitted inside the block go to a new Sequence."""
    outer = b.steps
    b.steps = []
    sequence = Sequence(b.steps)
    try:
        yield sequence
    finally:
        sequence.steps = b.steps
        b.steps = outer


def lower_block(b: Builder, block: ir.Block, args: list[Lowered], carried: list[Tensor] = ()) -> None:
    """`carried`: the loop's carried tensors when the block is its body,
    which the body's ops may then update in place."""
    for arg, value in zip(block.args, args, strict=True):
        b.values[arg] = value
    lower(b, FlatFunction(block.args, block.ops, block.results), fuse(block.ops),
          frozenset(t.id for t in carried))


def scalar_tensor(b: Builder, op: ir.Op, value: ir.Value) -> Tensor:
    """A scalar value (predicate, branch index) in a tensor of its own."""
    view = b.view(value, f"{name_of(op)}/predicate")
    if not view.is_whole_tensor or view.tensor.shape != ():
        view = copy_to_new(b, op, view.then("reshape", ()))
    return view.tensor


def _write_results(b: Builder, op: ir.Op, results: list[ir.Value], targets: list[Tensor]) -> None:
    """targets[i] = results[i], as if at once: results that are views of a
    target tensor are staged first (a loop body may swap carried values)."""
    sources = []
    for value, target in zip(results, targets, strict=True):
        lowered = b.values[value]
        if isinstance(lowered, View) and lowered.tensor is target and lowered.is_whole_tensor:
            sources.append(None)                   # unchanged
            continue
        sources.append(b.view(value, name_of(op)))
    ids = {t.id for t in targets}
    sources = [copy_to_new(b, op, s) if s is not None and s.tensor.id in ids else s for s in sources]
    for source, target in zip(sources, targets, strict=True):
        if source is not None:
            b.copy(source.then("reshape", target.shape), target)


def _integer_constant(b: Builder, block: ir.Block, value: ir.Value) -> int | None:
    """The value of an integer scalar constant made in `block` or outside it."""
    for inner in block.ops:
        if value in inner.results:
            found = inner.attrs.get("value") if inner.name == "constant" else None
            break
    else:
        outer = b.values.get(value)
        found = outer.value if isinstance(outer, Splat) else None
    if found is None or np.asarray(found).dtype.kind not in "iu" or np.asarray(found).size != 1:
        return None
    return int(np.asarray(found).reshape(()))


def trip_count(b: Builder, op: ir.Op) -> int | None:
    """Iterations of a counted loop: carried counter k starts at constant
    c0, the condition is `k < n` (n constant) and the body returns k + 1."""
    cond, body = op.regions
    if any(inner.name not in ("constant", "compare") for inner in cond.ops):
        return None     # the condition does more than count
    made = {r: inner for inner in cond.ops for r in inner.results}
    compare = made.get(cond.results[0]) if len(cond.results) == 1 else None
    if (compare is None or compare.name != "compare" or compare.attrs.get("comparison_direction") != "LT"
            or compare.operands[0] not in cond.args):
        return None
    k = cond.args.index(compare.operands[0])
    limit = _integer_constant(b, cond, compare.operands[1])
    start = _integer_constant(b, cond, op.operands[k])
    step = next((inner for inner in body.ops if body.results[k] in inner.results), None)
    if limit is None or start is None or step is None or step.name != "add" or body.args[k] not in step.operands:
        return None
    other = step.operands[1] if step.operands[0] is body.args[k] else step.operands[0]
    if _integer_constant(b, body, other) != 1:
        return None
    return max(limit - start, 0)


@register("optimization_barrier")
def optimization_barrier(b: Builder, op: ir.Op) -> None:
    """Its results are its operands: no step, no copy. What it guarantees
    is kept by the passes before lowering: the program order is kept (a
    fused cluster runs where its last op was, so nothing moves earlier),
    and a cluster read by the barrier is sealed while one reading its
    results starts anew (it is no element-wise op), so no fusion joins the
    recomputation jax.checkpoint puts after a barrier with the forward ops
    it repeats, and nothing computed after it is computed before it."""
    for operand, result in zip(op.operands, op.results, strict=True):
        b.values[result] = b.values[operand]


def _carried_in_streaming_memory(b: Builder, op: ir.Op, i: int) -> Tensor | None:
    """The tensor in streaming memory a loop carries value i in: the one
    it enters in, when the body never changes it or nothing else reads
    it (a stack the body writes a row at a time), else None (a copy)."""
    lowered = b.values[op.operands[i]]
    if not isinstance(lowered, View) or not lowered.is_whole_tensor or not lowered.tensor.streaming:
        return None
    body = op.regions[1]
    if body.results[i] is body.args[i] or b.writable_in_place(lowered, op):
        return lowered.tensor
    return None


@register("while")
def while_(b: Builder, op: ir.Op) -> None:
    cond, body = op.regions
    count = trip_count(b, op)
    in_streaming = set(op.attrs.get(streaming.CARRIED, ()))
    carried = []
    for i, value in enumerate(op.operands):
        t = _carried_in_streaming_memory(b, op, i) if i in in_streaming else None
        if t is not None:                   # no copy of it in streaming memory
            carried.append(t)
            continue
        t = b.tensor(f"{name_of(op)}/carried {i}", value.type.shape, value.type.dtype)
        t.streaming = i in in_streaming
        lowered = b.values[value]
        if isinstance(lowered, Splat):      # e.g. a scan's stacked outputs, zeros at first
            b.fill(t, lowered.value)
        else:
            b.copy(b.view(value, name_of(op)).then("reshape", t.shape), t)
        carried.append(t)
    if count is None:
        with collecting(b) as condition:
            lower_block(b, cond, [View(t) for t in carried])
            predicate = scalar_tensor(b, op, cond.results[0])
    with collecting(b) as loop_body:
        lower_block(b, body, [View(t) for t in carried], carried)
        _write_results(b, op, body.results, carried)
    if count is None:
        b.steps.append(RepeatWhileTrue(condition, predicate, loop_body, name_of(op)))
    else:
        b.steps.append(Repeat(count, loop_body, name_of(op)))
    for result, t in zip(op.results, carried, strict=True):
        b.values[result] = View(t)


def _branches(b: Builder, op: ir.Op) -> tuple[list[Sequence], list[Tensor]]:
    outs = [b.tensor(f"{name_of(op)}/result {i}", r.type.shape, r.type.dtype) for i, r in enumerate(op.results)]
    for i in op.attrs.get(streaming.RESULTS, ()):
        outs[i].streaming = True
    sequences = []
    for region in op.regions:
        with collecting(b) as sequence:
            lower_block(b, region, [])
            _write_results(b, op, region.results, outs)
        sequences.append(sequence)
    return sequences, outs


@register("if")
def if_(b: Builder, op: ir.Op) -> None:
    predicate = scalar_tensor(b, op, op.operands[0])
    (then_body, else_body), outs = _branches(b, op)
    b.steps.append(If(predicate, then_body, else_body))
    for result, t in zip(op.results, outs, strict=True):
        b.values[result] = View(t)


@register("case")
def case(b: Builder, op: ir.Op) -> None:
    """An index out of range runs the last branch, as in XLA."""
    index = scalar_tensor(b, op, op.operands[0])
    sequences, outs = _branches(b, op)
    b.steps.append(Switch(index, dict(enumerate(sequences[:-1])), sequences[-1]))
    for result, t in zip(op.results, outs, strict=True):
        b.values[result] = View(t)
