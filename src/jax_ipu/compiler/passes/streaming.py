"""Streaming memory: the DRAM beside each IPU (Poplar's remote buffers),
which JAX sees as the memory kind STREAMING_MEMORY_KIND ("pinned_host",
the kind its host-offloading code uses).

A program's arguments and results may live there (`mhlo.memory_kind` on
main's arguments and results), and `jax.device_put(x, ...)` inside jit
moves values between tile SRAM and streaming memory (JAX emits custom
calls `annotate_device_placement` whose `_xla_buffer_placement` names the
memory the value goes to), also inside loops and branches. Tiles compute
only on SRAM, so a value in streaming memory may be moved, kept, returned,
carried through a loop, or written and read a window at a time:

- a dynamic_slice of it moved to the tiles is one copy of the window (a
  scan reading its offloaded inputs or residuals a step at a time);
- a dynamic_update_slice into it of a value on the tiles (or of one just
  stored) is one copy into the window (a scan stacking offloaded outputs:
  the stack is a loop-carried tensor in streaming memory; when the loop
  writes every row before reading any, the stack starts uninitialised, as
  XLA's host offloader allocates it, and is never filled);
- ops that only arrange elements (concatenate, slice, transpose, ...) run
  on the tiles, on the values stored there (or loaded), and their results
  are stored (an unrolled scan concatenates the rows it stacks);
- ops JAX marks for the host (`compute_on('device_host')`, frontend
  attribute `_xla_compute_type = "host"`) run on the tiles: the IPU system
  has no processor beside its streaming memory, so the values in streaming
  memory they read are loaded onto the tiles first, and their results go
  where the function's out_memory_spaces put them;

anything else computing on such a value is refused at compile time,
naming the op. Moves lower to Copy (whole values) or StreamingCopy (a
window at an offset read at run time) steps named "StreamingMemory ...",
charged at the streaming memory's bandwidth (the target's
streaming_bytes_per_second, plus a latency per transfer); tensors in
streaming memory take no tile SRAM in the memory plan."""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.builder import Builder, Splat
from jax_ipu.compiler.lowering.indexing import scalar_source
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.compiler.passes.fuse import reads_of
from jax_ipu.errors import IpuCompileError
from jax_ipu.graph.programs import Copy, StreamingCopy, leaves
from jax_ipu.graph.views import View
from jax_ipu.targets import STREAMING_MEMORY_KIND, Target

PLACEMENT = "annotate_device_placement"
# The step names profiles file under streaming memory (profile.breakdown).
STEP_PREFIX = "StreamingMemory"
_LOAD, _STORE, _KEEP = "streaming_load", "streaming_store", "placement_unchanged"
_LOAD_WINDOW, _STORE_WINDOW = "streaming_load_window", "streaming_store_window"
_BUFFER = "streaming_buffer"          # a tensor in streaming memory, its contents undefined
_MOVES = frozenset({_LOAD, _STORE, _KEEP, _LOAD_WINDOW})
# What the names of ops JAX marks for the host end with (their compute
# sets' names in profiles and compiled.as_text()).
ON_TILES = " [compute_on('device_host'): on the tiles]"
# The op attributes naming a loop's carried values, or a branch op's
# results, held in streaming memory (read by lowering/control.py).
CARRIED, RESULTS = "streaming_carried", "streaming_results"


# Ops that only arrange elements: on values in streaming memory they run on
# the tiles (on the values stored there, or loaded), their results stored.
_ARRANGING = frozenset({"concatenate", "slice", "transpose", "pad", "reverse", "broadcast_in_dim"})


def _placement(op: ir.Op) -> str | None:
    if op.name != "custom_call" or str(op.attrs.get("call_target_name")) != PLACEMENT:
        return None
    attrs = op.attrs.get("mhlo.frontend_attributes") or {}
    return str(attrs.get("_xla_buffer_placement", "device"))


def _on_host(op: ir.Op) -> bool:
    """Whether JAX asked for the op to run on the host (compute_on)."""
    attrs = op.attrs.get("mhlo.frontend_attributes") or {}
    return str(attrs.get("_xla_compute_type", "")) == "host"


def _refuse(op: ir.Op, what: str) -> None:
    raise IpuCompileError(
        f"{op.name} at {op.loc} {what} a value in streaming memory (memory kind {STREAMING_MEMORY_KIND!r}): "
        f"IPU tiles compute only on values in their SRAM. Move it first: jax.device_put(x, "
        f"jax.memory.Space.Device) inside the jitted function (or a sharding with memory_kind='device'), "
        f"or compute on it under compute_on('device_host'), which loads it onto the tiles")


def _has_placement(ops) -> bool:
    """Whether an op moves a value between memories or runs "on the host"."""
    return any(_placement(op) or _on_host(op) or any(_has_placement(r.ops) for r in op.regions) for op in ops)


def _is_reshape(op: ir.Op) -> bool:
    """reshape, or a broadcast_in_dim adding axes of one element only."""
    if op.name == "reshape":
        return True
    if op.name != "broadcast_in_dim":
        return False
    dims = list(op.attrs.get("broadcast_dimensions", ()))
    return op.operands[0].type.size == op.results[0].type.size and dims == sorted(dims)


class _Rewriter:
    """Rewrites a function's ops, and their loops' and branches' regions,
    so that each value in streaming memory is only moved, and knows which
    values live there."""

    def __init__(self, streaming: set):
        self.streaming: set[ir.Value] = set(streaming)
        # Windows of tensors in streaming memory not moved yet: value ->
        # (tensor, starts, sizes); one copy of the window when loaded.
        self.windows: dict[ir.Value, tuple] = {}
        # Values in streaming memory stored from the tiles: value -> the
        # tile value (of the same elements).
        self.stored: dict[ir.Value, ir.Value] = {}
        self.constants: dict[ir.Value, np.ndarray] = {}

    def state(self) -> tuple:
        return set(self.streaming), dict(self.windows), dict(self.stored)

    def restore(self, state: tuple) -> None:
        self.streaming, self.windows, self.stored = (type(s)(s) for s in state)

    # -- emitting --
    @staticmethod
    def emit(out: list, name: str, operands: list, result_type, loc: str, **attrs) -> ir.Value:
        result = ir.Value(result_type)
        out.append(ir.Op(name, list(operands), [result], attrs, [], loc))
        return result

    def store(self, value: ir.Value, out: list, loc: str) -> ir.Value:
        stored = self.emit(out, _STORE, [value], value.type, loc)
        self.streaming.add(stored)
        self.stored[stored] = value
        return stored

    def on_tiles(self, value: ir.Value, out: list, loaded, loc: str) -> ir.Value:
        """The value, loaded onto the tiles when it is in streaming memory
        (once per block and the blocks it holds)."""
        if value not in self.streaming:
            return value
        if value not in loaded:
            if value in self.windows:
                loaded[value] = self.load_window(value, out, None, loc)
            else:
                loaded[value] = self.emit(out, _LOAD, [value], value.type, loc)
        return loaded[value]

    def load_window(self, value: ir.Value, out: list, into: ir.Value | None, loc: str) -> ir.Value:
        tensor, starts, sizes = self.windows[value]
        into = into or ir.Value(value.type)
        window = into if tuple(value.type.shape) == sizes else ir.Value(ir.TensorType(sizes, value.type.dtype))
        out.append(ir.Op(_LOAD_WINDOW, [tensor, *starts], [window], {"slice_sizes": sizes}, [], loc))
        if window is not into:
            out.append(ir.Op("reshape", [window], [into], {}, [], loc))
        return into

    def tile_value(self, value: ir.Value, out: list, loaded, loc: str) -> ir.Value:
        """A value on the tiles of the same elements: the value itself, the
        one stored as it (reshaped alike), or the value loaded."""
        if value not in self.streaming:
            return value
        source = self.stored.get(value)
        if source is None:
            return self.on_tiles(value, out, loaded, loc)
        return source if source.type == value.type else self.emit(out, "reshape", [source], value.type, loc)

    def in_streaming(self, value: ir.Value, out: list, loaded, loc: str) -> ir.Value:
        """The value as a value of its own in streaming memory (a window
        not moved yet goes through the tiles)."""
        if value in self.windows:
            return self.store(self.on_tiles(value, out, loaded, loc), out, loc)
        return value if value in self.streaming else self.store(value, out, loc)

    def alias(self, value: ir.Value, result: ir.Value) -> None:
        """`result` holds `value`'s elements where `value` is."""
        if value in self.streaming:
            self.streaming.add(result)
        if value in self.windows:
            self.windows[result] = self.windows[value]
        if value in self.stored:
            self.stored[result] = self.stored[value]

    # -- rewriting --
    def block(self, ops: list[ir.Op], loaded) -> list[ir.Op]:
        out: list[ir.Op] = []
        for op in ops:
            self.op(op, out, loaded)
        return out

    def op(self, op: ir.Op, out: list, loaded) -> None:
        if _on_host(op) and not op.loc.endswith(ON_TILES):
            op = dataclasses.replace(op, loc=op.loc + ON_TILES)      # named so in compute sets and profiles
        if op.name == "constant":
            self.constants[op.results[0]] = np.asarray(op.attrs.get("value"))
            out.append(op)
            return
        target = _placement(op)
        if target is not None:
            return self.move(op, target == STREAMING_MEMORY_KIND, out, loaded)
        if op.name == "while":
            return self.while_(op, out, loaded)
        if op.name in ("if", "case"):
            return self.branches(op, out, loaded)
        if op.name == "optimization_barrier":     # an identity: its results stay where its operands are
            operands = [self.in_streaming(v, out, loaded, op.loc) if v in self.windows else v for v in op.operands]
            for v, r in zip(operands, op.results, strict=False):
                self.alias(v, r)
            out.append(dataclasses.replace(op, operands=operands))
            return
        streaming = [v for v in op.operands if v in self.streaming]
        if streaming and _is_reshape(op):
            if op.operands[0] not in self.windows:       # a view of the tensor in streaming memory
                out.append(op)
            self.alias(op.operands[0], op.results[0])
            return
        starts_on_tiles = not any(v in self.streaming for v in op.operands[1:])
        if op.name == "dynamic_slice" and streaming and starts_on_tiles:
            tensor = op.operands[0]
            if tensor in self.windows:
                tensor = self.in_streaming(tensor, out, loaded, op.loc)
            self.windows[op.results[0]] = (tensor, list(op.operands[1:]), tuple(op.attrs["slice_sizes"]))
            self.streaming.add(op.results[0])
            return
        if op.name == "dynamic_update_slice" and streaming and not any(v in self.streaming for v in op.operands[2:]):
            tensor = self.in_streaming(op.operands[0], out, loaded, op.loc)
            update = self.tile_value(op.operands[1], out, loaded, op.loc)
            out.append(ir.Op(_STORE_WINDOW, [tensor, update, *op.operands[2:]], op.results,
                             {"slice_sizes": tuple(op.operands[1].type.shape)}, [], op.loc))
            self.streaming.add(op.results[0])
            return
        if streaming and op.name in _ARRANGING:
            operands = [self.tile_value(v, out, loaded, op.loc) for v in op.operands]
            arranged = [ir.Value(r.type) for r in op.results]
            out.append(dataclasses.replace(op, operands=operands, results=arranged))
            for result, value in zip(op.results, arranged, strict=False):
                out.append(ir.Op(_STORE, [value], [result], {}, [], op.loc))
                self.streaming.add(result)
                self.stored[result] = value
            return
        inner = [v for v in reads_of(op, regions_only=True) if v in self.streaming] if op.regions else []
        if not streaming and not inner:
            out.append(op)
            return
        if not _on_host(op):
            _refuse(op, "computes on" if streaming else "reads inside its body")
        if inner:
            _refuse(op, "reads inside its body")
        operands = [self.on_tiles(v, out, loaded, op.loc) for v in op.operands]
        out.append(dataclasses.replace(op, operands=operands))

    def move(self, op: ir.Op, to_streaming: bool, out: list, loaded) -> None:
        src, result = op.operands[0], op.results[0]
        if src in self.windows:
            if to_streaming:
                self.alias(src, result)
            else:
                self.load_window(src, out, result, op.loc)
            return
        if (src in self.streaming) == to_streaming:
            out.append(ir.Op(_KEEP, [src], [result], {}, [], op.loc))
            self.alias(src, result)
            return
        out.append(ir.Op(_STORE if to_streaming else _LOAD, [src], [result], {}, [], op.loc))
        if to_streaming:
            self.streaming.add(result)
            self.stored[result] = src

    def region(self, block: ir.Block, args: list[bool], loaded, want: list[bool] | None = None):
        """(the rewritten block, whether each of its results is in
        streaming memory); `want`: where its results must be."""
        for a, s in zip(block.args, args, strict=False):
            (self.streaming.add if s else self.streaming.discard)(a)
        inner = loaded.new_child()
        ops = self.block(block.ops, inner)
        results = list(block.results)
        for i, (value, w) in enumerate(zip(results, want or (), strict=False)):
            where = f"a result of the region at {block.ops[-1].loc if block.ops else 'unknown location'}"
            if w:
                results[i] = self.in_streaming(value, ops, inner, where)
            elif value in self.streaming:
                results[i] = self.on_tiles(value, ops, inner, where)
        return ir.Block(block.args, ops, results), [v in self.streaming for v in results]

    def while_(self, op: ir.Op, out: list, loaded) -> None:
        """A carried value is in streaming memory when it enters there or
        the body puts it there (a scan's stack of offloaded outputs)."""
        cond, body = op.regions
        carried = [v in self.streaming for v in op.operands]
        while True:
            saved = self.state()
            _, made = self.region(body, carried, loaded)
            self.restore(saved)
            grown = [c or m for c, m in zip(carried, made, strict=False)]
            if grown == carried:
                break
            carried = grown
        new_cond, predicate = self.region(cond, carried, loaded)
        if predicate[0]:
            _refuse(op, "tests")
        new_body, _ = self.region(body, carried, loaded, want=carried)
        operands = list(op.operands)
        for i, (value, s) in enumerate(zip(op.operands, carried, strict=False)):
            if not s:
                continue
            if value not in self.streaming and _written_before_read(self, op, new_cond, new_body, i):
                operands[i] = self.emit(out, _BUFFER, [], value.type, op.loc)
            else:
                operands[i] = self.in_streaming(value, out, loaded, op.loc)
        indices = tuple(i for i, s in enumerate(carried) if s)
        out.append(ir.Op(op.name, operands, op.results, {**op.attrs, CARRIED: indices}, [new_cond, new_body],
                         op.loc))
        self.streaming.update(op.results[i] for i in indices)

    def branches(self, op: ir.Op, out: list, loaded) -> None:
        """A result is in streaming memory when a branch leaves it there;
        the other branches store theirs."""
        if op.operands[0] in self.streaming:
            _refuse(op, "branches on")
        saved = self.state()
        made = [self.region(r, [], loaded)[1] for r in op.regions]
        self.restore(saved)
        want = [any(m[i] for m in made) for i in range(len(op.results))]
        regions = [self.region(r, [], loaded, want=want)[0] for r in op.regions]
        operands = [op.operands[0]] + [self.on_tiles(v, out, loaded, op.loc) for v in op.operands[1:]]
        indices = tuple(i for i, w in enumerate(want) if w)
        out.append(ir.Op(op.name, operands, op.results, {**op.attrs, RESULTS: indices} if indices else op.attrs,
                         regions, op.loc))
        self.streaming.update(op.results[i] for i in indices)


def _written_before_read(rw: _Rewriter, op: ir.Op, cond: ir.Block, body: ir.Block, i: int) -> bool:
    """Whether loop `op` writes every row of its carried value i before any
    read of it, so that its initial contents are never seen: a counted
    loop (k from 0 below n, by one) whose body only stores a row of the
    value at k (or at n - 1 - k, a reversed scan), n the value's rows."""
    arg, result = body.args[i], body.results[i]
    made = {r: inner for inner in body.ops for r in inner.results}
    store = made.get(result)
    shape = tuple(arg.type.shape)
    if store is None or store.name != _STORE_WINDOW or store.operands[0] is not arg or not shape:
        return False
    if store.attrs["slice_sizes"] != (1, *shape[1:]):
        return False
    reads = [v for inner in body.ops for v in reads_of(inner)] + list(body.results)
    if reads.count(arg) != 1 or any(v is cond.args[i] for inner in cond.ops for v in reads_of(inner)):
        return False
    count = _counted(rw, op, cond, body)
    if count is None:
        return False
    k, start, limit = count
    if start != 0 or limit != shape[0]:
        return False
    row = store.operands[2]
    if row is body.args[k]:
        return True
    # n - 1 - k, as (n - k) - 1 or (n - 1) - k
    first = made.get(row)
    if first is None or first.name != "subtract":
        return False
    a, b = first.operands
    if b is body.args[k]:
        return _constant(rw, a) == limit - 1
    second = made.get(a)
    return (_constant(rw, b) == 1 and second is not None and second.name == "subtract"
            and second.operands[1] is body.args[k] and _constant(rw, second.operands[0]) == limit)


def _constant(rw: _Rewriter, value: ir.Value) -> int | None:
    found = rw.constants.get(value)
    if found is None or found.size != 1 or found.dtype.kind not in "iu":
        return None
    return int(found.reshape(()))


def _counted(rw: _Rewriter, op: ir.Op, cond: ir.Block, body: ir.Block) -> tuple[int, int, int] | None:
    """(k, start, limit) of a loop counting carried value k from a
    constant start up below a constant limit by one, else None."""
    made = {r: inner for inner in cond.ops for r in inner.results}
    compare = made.get(cond.results[0])
    if compare is None or compare.name != "compare" or compare.attrs.get("comparison_direction") != "LT" \
            or compare.operands[0] not in cond.args:
        return None
    k = cond.args.index(compare.operands[0])
    limit, start = _constant(rw, compare.operands[1]), _constant(rw, op.operands[k])
    step = next((inner for inner in body.ops if body.results[k] in inner.results), None)
    if limit is None or start is None or step is None or step.name != "add" or body.args[k] not in step.operands:
        return None
    other = step.operands[1] if step.operands[0] is body.args[k] else step.operands[0]
    return (k, start, limit) if _constant(rw, other) == 1 else None


def _without_unused_moves(ops: list[ir.Op], results: list[ir.Value]) -> list[ir.Op]:
    """The ops without moves whose results nothing reads (a value stored
    and then written into a window straight from the tiles)."""
    uses = collections.Counter(results)

    def count(block_ops):
        for op in block_ops:
            uses.update(op.operands)
            for region in op.regions:
                count(region.ops)
                uses.update(region.results)
    count(ops)

    def prune(block_ops):
        kept = []
        for op in reversed(block_ops):
            if (op.name in _MOVES or _is_reshape(op)) and not any(uses[r] for r in op.results):
                uses.subtract(op.operands)
                continue
            if op.regions:
                op = dataclasses.replace(op, regions=[ir.Block(r.args, prune(r.ops), r.results) for r in op.regions])
            kept.append(op)
        return kept[::-1]
    return prune(ops)


def plan(flat, arg_kinds: list, result_kinds: list) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rewrites the flat program so that each value in streaming memory is
    only moved (see the module's docstring); results whose kind differs
    from their value's memory get a move. Returns (streaming arguments,
    streaming results)."""
    inputs = tuple(i for i, k in enumerate(arg_kinds or []) if k == STREAMING_MEMORY_KIND)
    if not inputs and not _has_placement(flat.ops) and STREAMING_MEMORY_KIND not in (result_kinds or []):
        return (), ()
    rw = _Rewriter({flat.args[i] for i in inputs})
    loaded = collections.ChainMap()
    ops = rw.block(flat.ops, loaded)
    outputs = []
    results = list(flat.results)
    for i, value in enumerate(results):
        want = i < len(result_kinds or []) and result_kinds[i] == STREAMING_MEMORY_KIND
        if want:
            outputs.append(i)
        if isinstance(value.type, ir.TensorType):
            where = f"result {i}"
            results[i] = rw.in_streaming(value, ops, loaded, where) if want else rw.on_tiles(value, ops, loaded, where)
    flat.ops[:] = _without_unused_moves(ops, results)
    flat.results[:] = results
    return inputs, tuple(outputs)


# -- lowering --
def _move(b: Builder, op: ir.Op, streaming_dst: bool) -> None:
    t = op.results[0].type
    what = "store" if streaming_dst else "load"
    dst = b.tensor(f"{STEP_PREFIX} {what} {op.loc}", t.shape, t.dtype)
    dst.streaming = streaming_dst
    lowered = b.values[op.operands[0]]
    if isinstance(lowered, Splat):       # one element from the tiles, broadcast on its way
        src = b.constant(f"{op.name}@{op.loc}/value", lowered.value).then("broadcast", tuple(t.shape), ())
    else:
        src = b.view(op.operands[0], f"{op.name}@{op.loc}")
    b.copy(src, dst)
    b.values[op.results[0]] = View(dst)


def _keep(b: Builder, op: ir.Op) -> None:
    b.values[op.results[0]] = b.values[op.operands[0]]


@register(_LOAD)
def _load(b: Builder, op: ir.Op) -> None:
    _move(b, op, False)


@register(_STORE)
def _store(b: Builder, op: ir.Op) -> None:
    _move(b, op, True)


register(_KEEP)(_keep)


@register(_BUFFER)
def _buffer(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    tensor = b.tensor(f"{STEP_PREFIX} buffer {op.loc}", t.shape, t.dtype)
    tensor.streaming = True
    b.values[op.results[0]] = View(tensor)


@register(_LOAD_WINDOW)
def _load_window(b: Builder, op: ir.Op) -> None:
    t = op.results[0].type
    buffer = b.view(op.operands[0], f"{op.name}@{op.loc}")
    tile = b.tensor(f"{STEP_PREFIX} load {op.loc}", t.shape, t.dtype)
    starts = tuple(scalar_source(b, v) for v in op.operands[1:])
    b.steps.append(StreamingCopy(buffer, tile, starts, tuple(op.attrs["slice_sizes"]), False, tile.name))
    b.values[op.results[0]] = View(tile)


@register(_STORE_WINDOW)
def _store_window(b: Builder, op: ir.Op) -> None:
    """In place when nothing reads the tensor afterwards (a loop's stack),
    else into a copy of it."""
    t = op.results[0].type
    buffer = b.view(op.operands[0], f"{op.name}@{op.loc}")
    if not b.writable_in_place(buffer, op):
        copied = b.tensor(f"{STEP_PREFIX} copy {op.loc}", t.shape, t.dtype)
        copied.streaming = True
        b.copy(buffer, copied)
        buffer = View(copied)
    update = b.view(op.operands[1], f"{op.name}@{op.loc}")
    if not update.is_whole_tensor:
        tile = b.tensor(f"{op.name}@{op.loc}/update", update.shape, update.dtype)
        b.copy(update, tile)
        update = View(tile)
    starts = tuple(scalar_source(b, v) for v in op.operands[2:])
    name = f"{STEP_PREFIX} store {op.loc}"
    b.steps.append(StreamingCopy(buffer, update.tensor, starts, tuple(op.attrs["slice_sizes"]), True, name))
    b.values[op.results[0]] = buffer if buffer.shape == tuple(t.shape) else buffer.then("reshape", tuple(t.shape))


def _is_streaming_copy(step) -> bool:
    return isinstance(step, Copy) and (step.dst.streaming or any(t.streaming for t in step.src.tensors))


def charge_streaming(target: Target, steps: list) -> None:
    """Moves to and from streaming memory take their bytes at its bandwidth
    plus a fixed latency, instead of an on-chip exchange."""
    per_cycle = target.streaming_bytes_per_second / target.clock_hz
    for step in steps:
        for leaf in leaves(step):
            if _is_streaming_copy(leaf):
                leaf.cycles = int(np.ceil(leaf.dst.nbytes / per_cycle)) + target.streaming_latency_cycles
                leaf.exchange_cycles = leaf.sync_cycles = 0
                leaf.exchange_bytes = 0
            elif isinstance(leaf, StreamingCopy):
                nbytes = int(np.prod(leaf.sizes, dtype=np.int64)) * leaf.tile.dtype.itemsize
                leaf.cycles = int(np.ceil(nbytes / per_cycle)) + target.streaming_latency_cycles
