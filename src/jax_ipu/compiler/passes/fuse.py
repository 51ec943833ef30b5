"""Groups chains of element-wise ops of one shape into clusters, each to
become one compute set (one fused vertex per tile evaluating the chain).

A cluster runs where its last op was, so it must not be joined once a value
of it has been read by an op outside it (it is then "sealed")."""
from __future__ import annotations

import dataclasses

from jax_ipu import ir
from jax_ipu.ops import ELEMENTWISE_OPS


@dataclasses.dataclass(eq=False)
class Cluster:
    shape: tuple[int, ...]
    ops: list[ir.Op]


def is_elementwise(op: ir.Op) -> bool:
    return op.name in ELEMENTWISE_OPS


def reads_of(op: ir.Op, regions_only: bool = False):
    """The values an op reads: its operands and, at any depth, what its
    regions' ops and results read (a loop body reads enclosing values)."""
    if not regions_only:
        yield from op.operands
    for region in op.regions:
        for inner in region.ops:
            yield from reads_of(inner)
        yield from region.results


def fuse(ops: list[ir.Op]) -> list[ir.Op | Cluster]:
    """The ops in program order, element-wise ones grouped into Clusters."""
    cluster_of: dict[ir.Op, Cluster] = {}
    producer: dict[ir.Value, ir.Op] = {}
    sealed: set[int] = set()
    position: dict[int, int] = {}         # id(cluster) -> index of its last op
    for index, op in enumerate(ops):
        joined = None
        if is_elementwise(op):
            shape = op.results[0].type.shape
            candidates = []
            for v in op.operands:
                c = cluster_of.get(producer.get(v))
                if c is not None and c.shape == shape and id(c) not in sealed and c not in candidates:
                    candidates.append(c)
            joined = candidates[0] if candidates else Cluster(shape, [])
            for other in candidates[1:]:
                joined.ops.extend(other.ops)
                for member in other.ops:
                    cluster_of[member] = joined
                position.pop(id(other))
            joined.ops.append(op)
            cluster_of[op] = joined
            position[id(joined)] = index
        for v in reads_of(op):
            c = cluster_of.get(producer.get(v))
            if c is not None and c is not joined:
                sealed.add(id(c))
        for r in op.results:
            producer[r] = op
    order = {op: i for i, op in enumerate(ops)}
    nodes: list[ir.Op | Cluster] = []
    for index, op in enumerate(ops):
        c = cluster_of.get(op)
        if c is None:
            nodes.append(op)
        elif position.get(id(c)) == index:
            c.ops.sort(key=order.__getitem__)
            nodes.append(c)
    return nodes
