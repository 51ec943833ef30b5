"""Kernels of collectives across IPUs (Poplar's GCL): what the replicas of a
program compute together over the IPU-Links. `groups` list the ranks
(replica * partitions + partition) that take part together; a rank in no
group works alone. Every replica reduces its group's contributions in
group order, so all of them get the same bits."""
from __future__ import annotations

from jax_ipu.graph.records import attribute, codelet, reads, writes
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.ops import REDUCE_OPS

# (Kernels that meet the other replicas: not pure, they run where the
# replica's own thread runs them.)


@codelet(pure=False)
class AllReduce:
    """The group's inputs reduced by `op`, in group order."""
    input: View = reads()
    op: str = attribute("str", choices=REDUCE_OPS)
    groups: tuple[tuple[int, ...], ...] = attribute("any")
    out: Tensor = writes()


@codelet(pure=False)
class ReduceScatter:
    """The group's reduction, then this member's chunk along `dim`."""
    input: View = reads()
    op: str = attribute("str", choices=REDUCE_OPS)
    dim: int = attribute("int")
    groups: tuple[tuple[int, ...], ...] = attribute("any")
    out: Tensor = writes()


@codelet(pure=False)
class AllGather:
    """The group's inputs concatenated along `dim`, in group order."""
    input: View = reads()
    dim: int = attribute("int")
    groups: tuple[tuple[int, ...], ...] = attribute("any")
    out: Tensor = writes()


@codelet(pure=False)
class AllToAll:
    """The input split in group-size chunks along split_dim, chunk j sent to
    member j; the chunks received concatenated along concat_dim."""
    input: View = reads()
    split_dim: int = attribute("int")
    concat_dim: int = attribute("int")
    groups: tuple[tuple[int, ...], ...] = attribute("any")
    out: Tensor = writes()


@codelet(pure=False)
class CollectivePermute:
    """out = the input of the rank whose pair sends here, zeros if none."""
    input: View = reads()
    pairs: tuple[tuple[int, int], ...] = attribute("any")     # (source rank, target rank)
    out: Tensor = writes()


@codelet(pure=False)
class ReplicaIndex:
    """out = this run's replica or partition index (uint32 scalar)."""
    which: str = attribute("str", choices=("replica", "partition"))
    out: Tensor = writes()


COLLECTIVES = (AllReduce, ReduceScatter, AllGather, AllToAll, CollectivePermute)
