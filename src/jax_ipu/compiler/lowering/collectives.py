"""Collectives across IPUs (all_reduce, reduce_scatter, all_gather,
all_to_all, collective_permute) and the replica / partition index: one
compute set each whose vertices sit on the output's tiles; the cost adds
the IPU-Link transfer of a ring over the group and a sync across IPUs.

Ranks: a program for R replicas x P partitions runs on R*P IPUs; rank =
replica * P + partition. JAX's pmap and shard_map emit one replica and P
partitions, with groups of partition ids, which are ranks then."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder
from jax_ipu.compiler.lowering.layout import copy_to_new, name_of
from jax_ipu.compiler.lowering.reduce import single_op
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets_collectives as cc
from jax_ipu.graph.compute import Region, Vertex
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.graph.views import View
from jax_ipu.ops import REDUCE_OPS
from jax_ipu.targets import Target


def _groups(op: ir.Op) -> tuple[tuple[int, ...], ...]:
    groups = op.attrs.get("replica_groups")
    if groups is None or np.size(groups) == 0:
        return ()                                  # everyone: filled in by the kernel's group lookup
    return tuple(tuple(int(r) for r in row if r >= 0) for row in np.atleast_2d(np.asarray(groups)))


def _input(b: Builder, op: ir.Op, value: ir.Value) -> View:
    view = b.view(value, name_of(op))
    return view if view.is_whole_tensor else copy_to_new(b, op, view)


def _emit(b: Builder, op: ir.Op, kernel, src: View, out, what: str, ops_per_element: int = 0) -> None:
    """One compute set: each tile handles its part of the input and output
    (sends and receives go over the IPU-Links; the cost pass adds them)."""
    tiles = np.union1d(src.tensor.mapping.tiles_used(), out.mapping.tiles_used())
    vertices = []
    for tile in tiles:
        reads = src.tensor.mapping.intervals_on(int(tile))
        writes = out.mapping.intervals_on(int(tile))
        n = int((writes[:, 1] - writes[:, 0]).sum()) if len(writes) else 0
        vertices.append(Vertex(f"{what}<{out.dtype.name}>", int(tile),
                               (Region(src.tensor, reads),) if len(reads) else (),
                               (Region(out, writes),) if len(writes) else (),
                               cost.reduce_cycles(b.target, n * ops_per_element, out.dtype)))
    b.execute(f"{what} {name_of(op)}", kernel, vertices)


def _group_size(groups) -> int:
    """For the on-tile reduction's estimate; no groups (all IPUs) count as two."""
    return max((len(g) for g in groups), default=2)


def _reduction(op: ir.Op) -> str:
    which = single_op(op.regions[0])
    if which is None:
        raise IpuUnimplementedError.for_op(op, f"a collective reduction other than {', '.join(REDUCE_OPS)} "
                                               "is not supported", "File an issue")
    return which


@register("all_reduce")
def all_reduce(b: Builder, op: ir.Op) -> None:
    which, groups = _reduction(op), _groups(op)
    for value, result in zip(op.operands, op.results, strict=True):
        src = _input(b, op, value)
        out = b.tensor(name_of(op), result.type.shape, result.type.dtype)
        n = _group_size(groups)
        _emit(b, op, cc.AllReduce(src, which, groups, out), src, out, f"AllReduce<{which}>", n - 1)
        b.values[result] = View(out)


@register("reduce_scatter")
def reduce_scatter(b: Builder, op: ir.Op) -> None:
    which, groups = _reduction(op), _groups(op)
    src = _input(b, op, op.operands[0])
    t = op.results[0].type
    out = b.tensor(name_of(op), t.shape, t.dtype)
    n = _group_size(groups)
    _emit(b, op, cc.ReduceScatter(src, which, int(op.attrs["scatter_dimension"]), groups, out), src, out,
          f"ReduceScatter<{which}>", n - 1)
    b.values[op.results[0]] = View(out)


@register("all_gather")
def all_gather(b: Builder, op: ir.Op) -> None:
    groups, dim = _groups(op), int(op.attrs["all_gather_dim"])
    for value, result in zip(op.operands, op.results, strict=True):
        src = _input(b, op, value)
        out = b.tensor(name_of(op), result.type.shape, result.type.dtype)
        _emit(b, op, cc.AllGather(src, dim, groups, out), src, out, "AllGather")
        b.values[result] = View(out)


@register("all_to_all")
def all_to_all(b: Builder, op: ir.Op) -> None:
    groups = _groups(op)
    split, concat = int(op.attrs["split_dimension"]), int(op.attrs["concat_dimension"])
    for value, result in zip(op.operands, op.results, strict=True):
        src = _input(b, op, value)
        out = b.tensor(name_of(op), result.type.shape, result.type.dtype)
        _emit(b, op, cc.AllToAll(src, split, concat, groups, out), src, out, "AllToAll")
        b.values[result] = View(out)


@register("collective_permute")
def collective_permute(b: Builder, op: ir.Op) -> None:
    pairs = tuple((int(s), int(t)) for s, t in np.asarray(op.attrs["source_target_pairs"]).reshape(-1, 2))
    src = _input(b, op, op.operands[0])
    t = op.results[0].type
    out = b.tensor(name_of(op), t.shape, t.dtype)
    _emit(b, op, cc.CollectivePermute(src, pairs, out), src, out, "CollectivePermute")
    b.values[op.results[0]] = View(out)


def _index(which: str):
    def rule(b: Builder, op: ir.Op) -> None:
        out = b.tensor(name_of(op), (), np.uint32)
        b.execute(f"{which}_id {name_of(op)}", cc.ReplicaIndex(which, out),
                  [Vertex(f"{which.capitalize()}Id", int(t), (), (Region(out, out.mapping.intervals_on(int(t))),),
                          b.target.supervisor_cycles) for t in out.mapping.tiles_used()])
        b.values[op.results[0]] = View(out)
    return rule



# -- cost over the IPU-Links --
# What a collective's compute set name ends with when its group spans
# IPU-Link domains (profiles count its cycles as GW-Link time).
OVER_GW_LINKS = " (over GW-Links)"


def link_cycles(target: Target, kernel, ranks: int, domains: tuple = ()) -> int:
    """What `kernel` (a collective over `ranks` IPUs) adds to its compute
    set: ring_cycles for its group and bytes. A ring over several IPU-Link
    domains (`domains`: each rank's) runs at the pace of its GW-Link
    crossings."""
    groups = getattr(kernel, "groups", None)
    n = max((len(g) for g in groups), default=ranks) if groups is not None else 2
    data = max(kernel.input.size * kernel.input.dtype.itemsize, kernel.out.nbytes)
    kind = ("all_reduce" if isinstance(kernel, cc.AllReduce)
            else "collective_permute" if isinstance(kernel, cc.CollectivePermute) else "all_gather")
    return ring_cycles(target, kind, data, n, domains_crossed(kernel, ranks, domains) if n > 1 else 0)


def ring_cycles(target: Target, kind: str, nbytes: int, n: int, crossings: int = 0) -> int:
    """A ring over a group of n IPUs: all_reduce moves 2(n-1)/n of the data
    through each IPU's links in 2(n-1) hops; all_gather, reduce_scatter and
    all_to_all (n-1)/n in n-1 hops; collective_permute all of it in one hop.
    Plus one sync across the IPUs. `crossings`: the IPU-Link domains the
    ring spans, less one; it then moves at the GW-Link rate when that is
    slower, plus a latency per crossing."""
    if n <= 1:
        return 0
    if kind == "all_reduce":
        volume, hops = 2 * (n - 1) / n * nbytes, 2 * (n - 1)
    elif kind == "collective_permute":
        volume, hops = nbytes, 1
    else:
        volume, hops = (n - 1) / n * nbytes, n - 1
    per_cycle = target.ipu_link_bytes_per_second * target.ipu_links_per_hop / target.clock_hz
    cycles = np.ceil(volume / per_cycle) + hops * target.ipu_link_latency_cycles + target.ipu_sync_cycles
    if crossings:
        gw_per_cycle = target.gw_link_bytes_per_second * target.gw_links_per_hop / target.clock_hz
        if gw_per_cycle < per_cycle:
            cycles += np.ceil(volume / gw_per_cycle) - np.ceil(volume / per_cycle)
        cycles += crossings * target.gw_link_latency_cycles
    return int(cycles)


def domains_crossed(kernel, ranks: int, domains: tuple) -> int:
    """How many IPU-Link domains the widest group spans, less one (0: one)."""
    if not domains:
        return 0
    if isinstance(kernel, cc.CollectivePermute):
        groups = kernel.pairs
    else:
        groups = getattr(kernel, "groups", None) or (tuple(range(ranks)),)
    return max((len({domains[r] for r in g if r < len(domains)}) - 1 for g in groups), default=0)


def charge_links(target: Target, steps: list, ranks: int, domains: tuple = ()) -> None:
    """Adds link time and the sync across IPUs to each collective's cycles."""
    for step in steps:
        for leaf in leaves(step):
            if isinstance(leaf, Execute) and isinstance(leaf.compute_set.kernel, cc.COLLECTIVES):
                kernel = leaf.compute_set.kernel
                leaf.cycles += link_cycles(target, kernel, ranks, domains)
                if domains_crossed(kernel, ranks, domains):
                    leaf.compute_set.name += OVER_GW_LINKS


def collective_cycles(program) -> int:
    """Cycles of one run's collective steps (outside loops: counted once)."""
    return sum(leaf.cycles for leaf in leaves(program.body)
               if isinstance(leaf, Execute) and isinstance(leaf.compute_set.kernel, cc.COLLECTIVES))


register("replica_id")(_index("replica"))
register("partition_id")(_index("partition"))
