"""Rules for data-dependent indexing: dynamic_slice, dynamic_update_slice,
gather and scatter. Each is one compute set planned as popops multiSlice /
multiUpdate (compiler.planners.slice.plan_slice): the table stays where it lives, the
indices are broadcast to its tiles, a vertex on each tile handles the
elements it holds, and a data-dependent exchange moves the slices to the
output or the updates to the table, in rounds of bounded buffers. XLA's
semantics: starts clamped into bounds, out-of-bounds scatter windows
skipped."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder, ScalarBroadcast, Splat
from jax_ipu.compiler.lowering.elementwise import SEMANTIC_ATTRS
from jax_ipu.compiler.lowering.layout import copy_to_new, name_of
from jax_ipu.compiler.lowering.reduce import single_op
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.compiler.planners.slice import plan_slice, plan_update
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets
from jax_ipu.graph import codelets_indexing as ci
from jax_ipu.graph.compute import Region, Vertex
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.ops import ELEMENTWISE_OPS


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


def _vertices(b: Builder, codelet: str, local: list[Tensor], outs: list[Tensor], sources: list,
              cycles: np.ndarray) -> list:
    """A vertex per tile holding part of `local` (the table) or of the
    outputs: it reads its part of the local tensors and the broadcast
    sources whole (tensors of views; immediates cost nothing), and writes
    its part of each output."""
    broadcast = tuple(Region(s.tensor, np.array([[0, s.tensor.size]])) for s in sources
                      if isinstance(s, View) and s.tensor.size)
    tiles = set()
    for t in [*local, *outs]:
        tiles.update(int(tile) for tile in t.mapping.tiles_used())
    vertices = []
    for tile in sorted(tiles):
        reads = tuple(Region(t, t.mapping.intervals_on(tile)) for t in local
                      if len(t.mapping.intervals_on(tile))) + broadcast
        writes = tuple(Region(o, o.mapping.intervals_on(tile)) for o in outs if len(o.mapping.intervals_on(tile)))
        vertices.append(Vertex(codelet, tile, reads, writes, int(cycles[tile])))
    return vertices


def _slice(b: Builder, op: ir.Op, what: str, kernel, table: View, out: Tensor, window: int, indices: list):
    """One multiSlice compute set: `out` holds windows of `window` elements
    of `table`, chosen by `indices`."""
    t = b.target
    windows = max(out.size // max(window, 1), 1)
    exchange, staged = plan_slice(t, table.tensor, out, windows, window, indices)
    cycles = np.array([t.supervisor_cycles * exchange.rounds + cost.worker_cycles(t, windows, 2, 1)
                       + cost.worker_cycles(t, int(n), 1, t.vector_width(out.dtype)) if n else 0 for n in staged])
    vertices = _vertices(b, f"{what}<{out.dtype.name}>", [table.tensor], [out], indices, cycles)
    b.execute(f"{what} {name_of(op)}", kernel, vertices, exchange)


def _update(b: Builder, op: ir.Op, what: str, kernel, xs: list[View], outs: list[Tensor], window: int,
            indices: list, updates: list[View], per_element: int):
    """One multiUpdate compute set: `outs`, mapped as the operands `xs`,
    are the operands with windows of `window` elements of `updates`
    written or combined in where `indices` say."""
    t = b.target
    windows = max(updates[0].size // max(window, 1), 1)
    exchange, applied = plan_update(t, outs[0], windows, window, indices, updates)
    held = outs[0].mapping.elements_per_tile(t.num_tiles)
    cycles = np.array([t.supervisor_cycles * exchange.rounds + cost.worker_cycles(t, windows, 2, 1)
                       + cost.worker_cycles(t, int(h), len(xs), t.vector_width(outs[0].dtype))
                       + cost.worker_cycles(t, int(n), per_element, 1) if h else 0
                       for h, n in zip(held, applied, strict=True)])
    vertices = _vertices(b, f"{what}<{outs[0].dtype.name}>", [x.tensor for x in xs], outs,
                         [*indices, *updates], cycles)
    b.execute(f"{what} {name_of(op)}", kernel, vertices, exchange)


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


@register("dynamic_slice")
def dynamic_slice(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    if t.size == 0:
        b.values[op.results[0]] = Splat(np.zeros((), t.dtype), t.shape)
        return
    x = whole(b, op, op.operands[0])
    starts = tuple(scalar_source(b, v) for v in op.operands[1:])
    out = b.tensor(name_of(op), t.shape, t.dtype)
    _slice(b, op, "DynamicSlice", ci.DynamicSlice(x, starts, out), x, out, out.size, list(starts))
    b.values[op.results[0]] = View(out)


@register("dynamic_update_slice")
def dynamic_update_slice(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    if t.size == 0 or op.operands[1].type.size == 0:
        b.values[op.results[0]] = b.values[op.operands[0]]
        return
    x = whole(b, op, op.operands[0])
    update = whole(b, op, op.operands[1])
    starts = tuple(scalar_source(b, v) for v in op.operands[2:])
    # In place when nothing reads the operand afterwards (a scan's stacked
    # outputs: otherwise every iteration copies the whole buffer, twice).
    out = x.tensor if b.writable_in_place(x, op) else b.tensor(name_of(op), t.shape, t.dtype, x.tensor.mapping)
    _update(b, op, "DynamicUpdateSlice", ci.DynamicUpdateSlice(x, update, starts, out), [x], [out],
            update.size, list(starts), [update], per_element=1)
    b.values[op.results[0]] = View(out) if out.shape == t.shape else View(out).then("reshape", t.shape)


@register("gather")
def gather(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    if t.size == 0:
        b.values[op.results[0]] = Splat(np.zeros((), t.dtype), t.shape)
        return
    x = whole(b, op, op.operands[0])
    indices = whole(b, op, op.operands[1])
    out = b.tensor(name_of(op), t.shape, t.dtype)
    slice_sizes = tuple(op.attrs["slice_sizes"])
    kernel = ci.Gather(x, indices, op.attrs["dimension_numbers"], slice_sizes, out)
    _slice(b, op, "Gather", kernel, x, out, int(np.prod(slice_sizes, dtype=np.int64)), [indices])
    b.values[op.results[0]] = View(out)


def _combiner(body: ir.Block, n: int) -> str | None:
    """"replace" when the body returns the update, the ufunc name of a
    one-op body on one operand, or None (run the body)."""
    if n == 1 and not body.ops and len(body.results) == 1 and body.results[0] is body.args[1]:
        return "replace"
    if n > 1 and not body.ops and list(body.results) == list(body.args[n:]):
        return "replace"
    if n == 1:
        return single_op(body)
    return None


@register("scatter")
def scatter(b: Builder, op: ir.Op) -> None:
    n = (len(op.operands) - 1) // 2
    types = [r.type for r in op.results]
    if types[0].size == 0 or op.operands[n + 1].type.size == 0:
        for r, v in zip(op.results, op.operands[:n], strict=True):
            b.values[r] = b.values[v]
        return
    body = op.regions[0]
    combiner = _combiner(body, n)
    program, results = region_program(b, op, body) if combiner is None else ((), ())
    xs = tuple(whole(b, op, v) for v in op.operands[:n])
    indices = whole(b, op, op.operands[n])
    updates = tuple(whole(b, op, v) for v in op.operands[n + 1:])
    outs = []
    for t, x in zip(types, xs, strict=True):      # in place as dynamic_update_slice; one output per tensor
        in_place = b.writable_in_place(x, op) and x.tensor not in outs
        outs.append(x.tensor if in_place else b.tensor(name_of(op), t.shape, t.dtype, x.tensor.mapping))
    outs = tuple(outs)
    dn = op.attrs["scatter_dimension_numbers"]
    window = int(np.prod([d for i, d in enumerate(updates[0].shape) if i in dn.update_window_dims], dtype=np.int64))
    kernel = ci.Scatter(xs, indices, updates, dn, combiner, program, results, outs)
    _update(b, op, f"Scatter[{combiner or 'body'}]", kernel, list(xs), list(outs), window, [indices],
            list(updates), per_element=2 + len(program))
    for r, out, t in zip(op.results, outs, types, strict=True):
        b.values[r] = View(out) if out.shape == t.shape else View(out).then("reshape", t.shape)
