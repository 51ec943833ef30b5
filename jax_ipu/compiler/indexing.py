"""Rules for data-dependent indexing: dynamic_slice, dynamic_update_slice,
gather and scatter. Each is one compute set: a vertex per tile of the
output's linear mapping that reads its indices and the whole operand it
indexes into (the indices are known only at run time, so the exchange
charged is that upper bound), with XLA's semantics: starts clamped into
bounds, out-of-bounds scatter windows skipped."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder, ScalarBroadcast, Splat
from jax_ipu.compiler.layout import copy_to_new, name_of
from jax_ipu.compiler.elementwise import SEMANTIC_ATTRS
from jax_ipu.compiler.reduce import SINGLE_OP
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets, codelets_indexing as ci
from jax_ipu.graph.compute import Region, Vertex
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.model.elementwise import ELEMENTWISE_OPS


def whole(b: Builder, op: ir.Op, value: ir.Value) -> View:
    """The value as a view reading a whole tensor in its own order."""
    x = b.view(value, name_of(op))
    return x if x.is_whole_tensor else copy_to_new(b, op, x)


def scalar_source(b: Builder, value: ir.Value) -> View | np.ndarray:
    """A scalar operand: an immediate, or a one-element view."""
    lowered = b.values[value]
    if isinstance(lowered, Splat):
        return lowered.value
    if isinstance(lowered, ScalarBroadcast):
        return lowered.scalar
    return lowered.then("reshape", ())


def indexed_vertices(b: Builder, codelet: str, outs: list[Tensor], sources: list, per_element: int) -> list:
    """A vertex per tile of the outputs' mapping, reading every source
    whole (tensors of views; immediates cost nothing)."""
    reads = tuple(Region(s.tensor, np.array([[0, s.tensor.size]])) for s in sources
                  if isinstance(s, View) and s.tensor.size)
    m = outs[0].mapping
    vertices = []
    for tile in m.tiles_used():
        intervals = m.intervals_on(tile)
        n = int((intervals[:, 1] - intervals[:, 0]).sum())
        vertices.append(Vertex(codelet, int(tile), reads, tuple(Region(o, intervals) for o in outs),
                               b.target.supervisor_cycles + cost.worker_cycles(b.target, n, per_element, 1)))
    return vertices


def region_program(b: Builder, op: ir.Op, body: ir.Block) -> tuple[tuple, tuple]:
    """A scalar region (scatter update, sort comparator) as (instructions,
    result registers): registers are the block's arguments, then the
    instructions' results. Constants, also those the region reads from
    outside (JAX hoists them), become "constant" instructions."""
    registers = {arg: i for i, arg in enumerate(body.args)}
    program = []

    def constant(value: np.ndarray, dtype) -> int:
        value = np.asarray(value).astype(dtype).reshape(())
        program.append(codelets.Instruction("constant", (), np.dtype(dtype), (("value", value),)))
        return len(body.args) + len(program) - 1

    def register(v: ir.Value) -> int:
        if v not in registers:
            outer = b.values.get(v)
            if not isinstance(outer, Splat):
                raise IpuUnimplementedError.for_op(
                    op, "the region reads a non-constant value from outside it", "File an issue")
            registers[v] = constant(outer.value, v.type.dtype)
        return registers[v]
    for inner in body.ops:
        dtype = inner.results[0].type.dtype
        if inner.name == "constant":
            registers[inner.results[0]] = constant(inner.attrs["value"], dtype)
        elif inner.name in ELEMENTWISE_OPS and len(inner.results) == 1:
            args = tuple(register(v) for v in inner.operands)
            attrs = tuple(sorted((k, inner.attrs[k]) for k in SEMANTIC_ATTRS if k in inner.attrs))
            program.append(codelets.Instruction(inner.name, args, dtype, attrs))
            registers[inner.results[0]] = len(body.args) + len(program) - 1
        elif inner.name in ("reshape", "broadcast_in_dim") and inner.results[0].type.size == 1:
            registers[inner.results[0]] = register(inner.operands[0])   # scalars stay scalars
        else:
            raise IpuUnimplementedError.for_op(
                op, f"a region with stablehlo.{inner.name} is not supported (regions may hold element-wise "
                    "ops and constants)", "File an issue")
    return tuple(program), tuple(register(v) for v in body.results)


def _emit(b: Builder, op: ir.Op, what: str, kernel, outs: list[Tensor], sources: list, per_element: int = 2):
    codelet = f"{what}<{outs[0].dtype.name}>"
    b.execute(f"{what} {name_of(op)}", kernel, indexed_vertices(b, codelet, outs, sources, per_element))


def dynamic_slice(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    if t.size == 0:
        b.values[op.results[0]] = Splat(np.zeros((), t.dtype), t.shape)
        return
    x = whole(b, op, op.operands[0])
    starts = tuple(scalar_source(b, v) for v in op.operands[1:])
    out = b.tensor(name_of(op), t.shape, t.dtype)
    _emit(b, op, "DynamicSlice", ci.DynamicSlice(x, starts, out), [out], [x, *starts])
    b.values[op.results[0]] = View(out)


def dynamic_update_slice(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    if t.size == 0 or op.operands[1].type.size == 0:
        b.values[op.results[0]] = b.values[op.operands[0]]
        return
    x = whole(b, op, op.operands[0])
    update = whole(b, op, op.operands[1])
    starts = tuple(scalar_source(b, v) for v in op.operands[2:])
    out = b.tensor(name_of(op), t.shape, t.dtype)
    _emit(b, op, "DynamicUpdateSlice", ci.DynamicUpdateSlice(x, update, starts, out), [out],
          [x, update, *starts], per_element=1)
    b.values[op.results[0]] = View(out)


def gather(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    if t.size == 0:
        b.values[op.results[0]] = Splat(np.zeros((), t.dtype), t.shape)
        return
    x = whole(b, op, op.operands[0])
    indices = whole(b, op, op.operands[1])
    out = b.tensor(name_of(op), t.shape, t.dtype)
    kernel = ci.Gather(x, indices, op.attrs["dimension_numbers"], tuple(op.attrs["slice_sizes"]), out)
    _emit(b, op, "Gather", kernel, [out], [x, indices], per_element=3)
    b.values[op.results[0]] = View(out)


def _combiner(body: ir.Block, n: int) -> str | None:
    """"replace" when the body returns the update, the ufunc name of a
    one-op body on one operand, or None (run the body)."""
    if n == 1 and not body.ops and len(body.results) == 1 and body.results[0] is body.args[1]:
        return "replace"
    if n > 1 and not body.ops and list(body.results) == list(body.args[n:]):
        return "replace"
    if (n == 1 and len(body.ops) == 1 and body.ops[0].name in SINGLE_OP and len(body.results) == 1
            and body.results[0] is body.ops[0].results[0] and set(body.ops[0].operands) == set(body.args)):
        return body.ops[0].name
    return None


def scatter(b: Builder, op: ir.Op) -> None:
    n = (len(op.operands) - 1) // 2
    types = [r.type for r in op.results]
    if types[0].size == 0 or op.operands[n + 1].type.size == 0:
        for r, v in zip(op.results, op.operands[:n]):
            b.values[r] = b.values[v]
        return
    body = op.regions[0]
    combiner = _combiner(body, n)
    program, results = region_program(b, op, body) if combiner is None else ((), ())
    xs = tuple(whole(b, op, v) for v in op.operands[:n])
    indices = whole(b, op, op.operands[n])
    updates = tuple(whole(b, op, v) for v in op.operands[n + 1:])
    mapping = b.linear_mapping(types[0].size, types[0].dtype)
    outs = tuple(b.tensor(name_of(op), t.shape, t.dtype, mapping) for t in types)
    kernel = ci.Scatter(xs, indices, updates, op.attrs["scatter_dimension_numbers"], combiner, program,
                        results, outs)
    _emit(b, op, f"Scatter[{combiner or 'body'}]", kernel, list(outs), [*xs, indices, *updates],
          per_element=2 + len(program))
    for r, out in zip(op.results, outs):
        b.values[r] = View(out)


RULES = {
    "dynamic_slice": dynamic_slice, "dynamic_update_slice": dynamic_update_slice,
    "gather": gather, "scatter": scatter,
}
