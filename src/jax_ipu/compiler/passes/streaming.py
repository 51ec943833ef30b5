"""Streaming memory: the DRAM beside each IPU (Poplar's remote buffers),
which JAX sees as the memory kind STREAMING_MEMORY_KIND ("pinned_host",
the kind its host-offloading code uses).

A program's arguments and results may live there (`mhlo.memory_kind` on
main's arguments and results), and `jax.device_put(x, ...)` inside jit
moves values between tile SRAM and streaming memory (JAX emits custom
calls `annotate_device_placement` whose `_xla_buffer_placement` names the
memory the value goes to). Tiles compute only on SRAM: a value in
streaming memory may be moved to SRAM, kept, or returned, nothing else; a
program doing more is refused at compile time, naming the op.

Moves lower to Copy steps charged at the streaming memory's bandwidth (the
target's streaming_bytes_per_second, plus a latency per transfer), and the
tensors in streaming memory take no tile SRAM in the memory plan."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.builder import Builder
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.errors import IpuCompileError
from jax_ipu.graph.programs import Copy, leaves
from jax_ipu.graph.views import View
from jax_ipu.targets import STREAMING_MEMORY_KIND, Target

PLACEMENT = "annotate_device_placement"
# The step names profiles file under streaming memory (profile.breakdown).
STEP_PREFIX = "StreamingMemory"
_LOAD, _STORE, _KEEP = "streaming_load", "streaming_store", "placement_unchanged"


def _placement(op: ir.Op) -> str | None:
    if op.name != "custom_call" or str(op.attrs.get("call_target_name")) != PLACEMENT:
        return None
    attrs = op.attrs.get("mhlo.frontend_attributes") or {}
    return str(attrs.get("_xla_buffer_placement", "device"))


def _refuse(op: ir.Op, what: str) -> None:
    raise IpuCompileError(
        f"{op.name} at {op.loc} {what} a value in streaming memory (memory kind {STREAMING_MEMORY_KIND!r}): "
        f"IPU tiles compute only on values in their SRAM. Move it first: jax.device_put(x, "
        f"jax.memory.Space.Device) inside the jitted function (or a sharding with memory_kind='device')")


def plan(flat, arg_kinds: list, result_kinds: list) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Checks the flat program's uses of streaming memory and names its
    moves (ops renamed in place: streaming_load, streaming_store, or
    placement_unchanged); results whose kind differs from their value's
    memory get a move. Returns (streaming arguments, streaming results)."""
    from jax_ipu.compiler.passes.fuse import reads_of
    inputs = tuple(i for i, k in enumerate(arg_kinds or []) if k == STREAMING_MEMORY_KIND)
    streaming = {flat.args[i] for i in inputs}
    if not streaming and not any(_placement(op) for op in flat.ops) and \
            STREAMING_MEMORY_KIND not in (result_kinds or []):
        return (), ()
    ops = []
    for op in flat.ops:
        target = _placement(op)
        if target is not None:
            src = op.operands[0]
            to_streaming = target == STREAMING_MEMORY_KIND
            if to_streaming:
                streaming.add(op.results[0])
            name = _KEEP if (src in streaming) == to_streaming else (_STORE if to_streaming else _LOAD)
            ops.append(ir.Op(name, op.operands, op.results, {}, [], op.loc))
            continue
        if op.name == "optimization_barrier":     # an identity: its results stay where its operands are
            streaming.update(r for v, r in zip(op.operands, op.results, strict=True) if v in streaming)
            ops.append(op)
            continue
        if any(v in streaming for v in op.operands):
            _refuse(op, "computes on")
        if op.regions and any(v in streaming for v in reads_of(op, regions_only=True)):
            _refuse(op, "reads inside its body")
        ops.append(op)
    outputs = []
    results = list(flat.results)
    for i, value in enumerate(results):
        want = i < len(result_kinds or []) and result_kinds[i] == STREAMING_MEMORY_KIND
        if want:
            outputs.append(i)
        if isinstance(value.type, ir.TensorType) and want != (value in streaming):
            moved = ir.Value(value.type)
            ops.append(ir.Op(_STORE if want else _LOAD, [value], [moved], {}, [], f"result {i}"))
            results[i] = moved
    flat.ops[:] = ops
    flat.results[:] = results
    return inputs, tuple(outputs)


def _move(b: Builder, op: ir.Op, streaming_dst: bool) -> None:
    src = b.view(op.operands[0], f"{op.name}@{op.loc}")
    t = op.results[0].type
    what = "store" if streaming_dst else "load"
    dst = b.tensor(f"{STEP_PREFIX} {what} {op.loc}", t.shape, t.dtype)
    dst.streaming = streaming_dst
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


def _is_streaming_copy(step) -> bool:
    return isinstance(step, Copy) and (step.dst.streaming or any(t.streaming for t in step.src.tensors))


def charge_streaming(target: Target, steps: list) -> None:
    """Moves to and from streaming memory take their bytes at its bandwidth
    plus a fixed latency, instead of an on-chip exchange."""
    per_cycle = target.streaming_bytes_per_second / target.clock_hz
    for step in steps:
        for leaf in leaves(step):
            if _is_streaming_copy(leaf):
                nbytes = leaf.dst.nbytes
                leaf.cycles = int(np.ceil(nbytes / per_cycle)) + target.streaming_latency_cycles
                leaf.exchange_cycles = leaf.sync_cycles = 0
                leaf.exchange_bytes = 0
