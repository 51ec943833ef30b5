"""Executors of the collective kernels (graph.codelets_collectives): each
replica posts its input to the launch (model.links) and computes its result
from its group's contributions, in group order (also when some come from
other processes: results equal one process's, bit for bit)."""
from __future__ import annotations

import numpy as np

from jax_ipu.errors import IpuRuntimeError
from jax_ipu.graph import codelets_collectives as cc
from jax_ipu.model import links
from jax_ipu.model.registry import reference
from jax_ipu.ops import implementation
from jax_ipu.targets import BFLOAT16


def _group_of(groups, rank: int, size: int) -> tuple[int, ...]:
    if not groups:                       # no groups: all the launch's IPUs
        return tuple(range(size))
    for group in groups:
        if rank in group:
            return group
    return (rank,)


def _with_group(get, groups, state, use):
    """use(this rank's group's inputs in group order, its position there)."""
    me = links.current()
    value = np.asarray(get(state))
    group = _group_of(groups, me.rank, me.launch.size if me.launch else 1)
    if me.launch is None:
        if len(group) > 1:
            raise IpuRuntimeError(f"a collective over ranks {list(group)} ran on one IPU; run the "
                                  "program on all its devices")
        return use([value], 0)
    return me.launch.exchange(me.rank, value, lambda values: use([values[r] for r in group],
                                                                 group.index(me.rank)),
                              me.launch.crosses(groups))


def _reduce(values: list[np.ndarray], op: str, dtype) -> np.ndarray:
    """The values combined in rank order, as the IPU's op computes them: a
    bfloat16 sum or product accumulates in float32 and rounds once, as
    XLA promotes bfloat16 all-reduces; a complex product as ops_complex."""
    acc_dtype = np.dtype(np.float32) if dtype == BFLOAT16 and op in ("add", "multiply") else np.dtype(dtype)
    fn, takes_out = implementation(op, [acc_dtype, acc_dtype], acc_dtype, {})
    acc = values[0].astype(acc_dtype, copy=True)
    for v in values[1:]:
        if takes_out:
            fn(acc, v, out=acc)
        else:
            acc = np.asarray(fn(acc, v)).astype(acc_dtype, copy=False)
    return acc.astype(dtype, copy=False)


@reference(cc.AllReduce)
def _build_all_reduce(k: cc.AllReduce, read):
    get, tid, op, groups, dtype, shape = read(k.input), k.out.id, k.op, k.groups, k.out.dtype, k.out.shape

    def run(state):
        state[tid] = _with_group(get, groups, state, lambda values, me: _reduce(values, op, dtype)).reshape(shape)
    return run


@reference(cc.ReduceScatter)
def _build_reduce_scatter(k: cc.ReduceScatter, read):
    get, tid, op, dim, groups, dtype = read(k.input), k.out.id, k.op, k.dim, k.groups, k.out.dtype

    def scatter(values, me):
        return np.ascontiguousarray(np.split(_reduce(values, op, dtype), len(values), axis=dim)[me])

    def run(state):
        state[tid] = _with_group(get, groups, state, scatter)
    return run


@reference(cc.AllGather)
def _build_all_gather(k: cc.AllGather, read):
    get, tid, dim, groups = read(k.input), k.out.id, k.dim, k.groups

    def run(state):
        state[tid] = _with_group(get, groups, state, lambda values, me: np.concatenate(values, axis=dim))
    return run


@reference(cc.AllToAll)
def _build_all_to_all(k: cc.AllToAll, read):
    get, tid, split, concat, groups = read(k.input), k.out.id, k.split_dim, k.concat_dim, k.groups

    def exchange(values, me):
        return np.concatenate([np.split(v, len(values), axis=split)[me] for v in values], axis=concat)

    def run(state):
        state[tid] = _with_group(get, groups, state, exchange)
    return run


@reference(cc.CollectivePermute)
def _build_collective_permute(k: cc.CollectivePermute, read):
    get, tid, dtype, shape = read(k.input), k.out.id, k.out.dtype, k.out.shape
    source_of = {target: source for source, target in k.pairs}

    def receive(values, source):
        if source is None:
            return np.zeros(shape, dtype)
        if source >= len(values):
            raise IpuRuntimeError(f"collective_permute from rank {source}, but the program runs on "
                                  f"{len(values)} IPUs")
        return np.array(values[source], dtype=dtype).reshape(shape)

    def run(state):
        me = links.current()
        value, source = np.asarray(get(state)), source_of.get(me.rank)
        if me.launch is None:
            state[tid] = receive([value], source)
        else:
            state[tid] = me.launch.exchange(me.rank, value, lambda values: receive(values, source),
                                            me.launch.crosses(k.pairs))
    return run


@reference(cc.ReplicaIndex)
def _build_replica_index(k: cc.ReplicaIndex, read):
    tid, which = k.out.id, k.which

    def run(state):
        state[tid] = np.array(getattr(links.current(), which), dtype=np.uint32)
    return run
