"""Kernels of collectives across IPUs (Poplar's GCL): what the replicas of a
program compute together over the IPU-Links. `groups` list the ranks
(replica * partitions + partition) that take part together; a rank in no
group works alone. Every replica reduces its group's contributions in
group order, so all of them get the same bits."""
from __future__ import annotations

import dataclasses

from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View


@dataclasses.dataclass(eq=False)
class AllReduce:
    input: View
    op: str                        # "add" | "multiply" | "maximum" | "minimum" | "and" | "or" | "xor"
    groups: tuple[tuple[int, ...], ...]
    out: Tensor


@dataclasses.dataclass(eq=False)
class ReduceScatter:
    """The group's reduction, then this member's chunk along `dim`."""
    input: View
    op: str
    dim: int
    groups: tuple[tuple[int, ...], ...]
    out: Tensor


@dataclasses.dataclass(eq=False)
class AllGather:
    """The group's inputs concatenated along `dim`, in group order."""
    input: View
    dim: int
    groups: tuple[tuple[int, ...], ...]
    out: Tensor


@dataclasses.dataclass(eq=False)
class AllToAll:
    """The input split in group-size chunks along split_dim, chunk j sent to
    member j; the chunks received concatenated along concat_dim."""
    input: View
    split_dim: int
    concat_dim: int
    groups: tuple[tuple[int, ...], ...]
    out: Tensor


@dataclasses.dataclass(eq=False)
class CollectivePermute:
    """out = the input of the rank whose pair sends here, zeros if none."""
    input: View
    pairs: tuple[tuple[int, int], ...]     # (source rank, target rank)
    out: Tensor


@dataclasses.dataclass(eq=False)
class ReplicaIndex:
    """out = this run's replica or partition index (uint32 scalar)."""
    which: str                     # "replica" | "partition"
    out: Tensor


COLLECTIVES = (AllReduce, ReduceScatter, AllGather, AllToAll, CollectivePermute)
