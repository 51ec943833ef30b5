"""Lowers the fused op list to graph tensors and steps: each op by the
rule registered for its name (compiler/lowering/), each fused cluster of
element-wise ops as one compute set."""
from __future__ import annotations

import collections

from jax_ipu import ir
from jax_ipu.compiler.builder import Builder
from jax_ipu.compiler.lowering.elementwise import lower_cluster
from jax_ipu.compiler.lowering.registry import RULES
from jax_ipu.compiler.passes.emulate import EMULATES
from jax_ipu.compiler.passes.fuse import Cluster, reads_of
from jax_ipu.compiler.passes.legalize import FlatFunction
from jax_ipu.errors import IpuError, IpuInternalCompilerError, IpuUnimplementedError
from jax_ipu.targets import BFLOAT16, COMPLEX64


def _used_outside(nodes, results) -> dict[int, set]:
    """Per cluster (by id), the values it makes that others read."""
    owner = {}
    for node in nodes:
        if isinstance(node, Cluster):
            for op in node.ops:
                owner[op.results[0]] = node
    outside: dict[int, set] = {id(n): set() for n in nodes if isinstance(n, Cluster)}
    for node in nodes:
        ops = node.ops if isinstance(node, Cluster) else [node]
        for op in ops:
            for v in op.operands:
                c = owner.get(v)
                if c is not None and c is not node:
                    outside[id(c)].add(v)
            for v in reads_of(op, regions_only=True):   # nested bodies read enclosing values
                if v in owner:
                    outside[id(owner[v])].add(v)
    for v in results:
        if v in owner:
            outside[id(owner[v])].add(v)
    return outside


def _lazy_broadcasts(nodes, results) -> set:
    """The broadcast_in_dim results that only element-wise clusters read
    (not another op, a nested body, or the block's results): those stay
    unmaterialised (builder.Broadcast). An element-wise op's operands have
    its shape and it has no body, so a cluster reads them as they are."""
    lazy = {node.results[0] for node in nodes
            if not isinstance(node, Cluster) and node.name == "broadcast_in_dim"} - set(results)
    for node in nodes:
        if not isinstance(node, Cluster):
            lazy -= set(reads_of(node))
    return lazy


def lower(b: Builder, flat: FlatFunction, nodes: list, carried: frozenset[int] = frozenset()) -> None:
    """`carried`: tensor ids of the loop-carried values when `flat` is a
    loop's body (its ops may update them in place)."""
    outside = _used_outside(nodes, flat.results)
    saved = b.pending_reads, b.block_tensors_from, b.block_carried, b.lazy_broadcasts
    b.lazy_broadcasts = _lazy_broadcasts(nodes, flat.results)
    b.pending_reads = collections.Counter(flat.results)
    for node in nodes:
        for op in (node.ops if isinstance(node, Cluster) else [node]):
            b.pending_reads.update(reads_of(op))
    b.block_tensors_from, b.block_carried = len(b.tensors), carried
    try:
        for node in nodes:
            _lower_node(b, node, outside)
            for op in (node.ops if isinstance(node, Cluster) else [node]):
                b.pending_reads.subtract(reads_of(op))
    finally:
        b.pending_reads, b.block_tensors_from, b.block_carried, b.lazy_broadcasts = saved


# Ops whose vertices compute (combine, compare) values rather than move
# them: on an emulated type, their steps are charged to it.
_COMPUTING = frozenset({"reduce", "reduce_window", "select_and_scatter", "scatter", "sort", "all_reduce",
                        "reduce_scatter", "cholesky", "triangular_solve", "custom_call"})


def _emulation(node) -> tuple | None:
    """(what it emulates, its number) when the op's steps are charged to an
    emulated type: an op an expansion made (passes/emulate.py), or one
    that computes on bfloat16 or complex64 values."""
    tagged = node.attrs.get(EMULATES)
    if tagged is not None or node.name not in _COMPUTING:
        return tagged
    types = {v.type.dtype for v in list(node.operands) + list(node.results) if isinstance(v.type, ir.TensorType)}
    kind = "complex64" if COMPLEX64 in types else "bfloat16" if BFLOAT16 in types else None
    return (f"{kind} {node.name}", id(node)) if kind else None


def _lower_node(b: Builder, node, outside: dict) -> None:
    if isinstance(node, Cluster):
        lower_cluster(b, node, outside[id(node)])
        return
    rule = RULES.get(node.name)
    if rule is None:     # (custom calls always have a rule: it names an unknown target)
        raise IpuUnimplementedError.for_op(node, "this op is not supported by jax-ipu yet",
                                           "File an issue, or avoid the op in this program")
    saved, b.emulating = b.emulating, _emulation(node)
    try:
        rule(b, node)
    except IpuError:
        raise
    except Exception as exc:  # a compiler bug: say where it happened
        raise IpuInternalCompilerError.for_op(
            node, f"internal error {type(exc).__name__}: {exc}",
            "This is a jax-ipu bug: please report it with this message") from exc
    finally:
        if b.emulating is not None:      # counted even when it made no step (a view)
            what, source = b.emulating
            b.emulated.append((None, what, 0.0, source))
        b.emulating = saved
