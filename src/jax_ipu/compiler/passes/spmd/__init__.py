"""SPMD partitioning: a program over P partitions (jax.shard_map, pmap, jit
of sharded arrays) -> the program each IPU runs on its part.

JAX sends the global program with Shardy annotations: a sharding per
argument and result (`#sdy.sharding<@mesh, [{"i"}, {}]>`: dimension 0
split over mesh axis "i"), `sdy.sharding_constraint` / `sdy.reshard` on
values, and `sdy.manual_computation` regions (shard_map) whose body works
on each IPU's part for its manual axes and names its collectives.

Each IPU's program takes its part of every argument and walks the ops
once (sharding.py: what a split means; partitioner.py: the walk and the
collectives that move a value between splits; rules.py: one rule per op;
local.py: slices of whole values made from the slices of their inputs;
table.py: gathers from a table split by rows). A rule that meets a case
it does not take gathers the operands whole: slower, never wrong."""
from __future__ import annotations

from jax_ipu import ir
from jax_ipu.compiler.passes.spmd.partitioner import Partitioner
from jax_ipu.errors import IpuUnimplementedError

__all__ = ["partition"]


def partition(module: ir.Module, inspect_sharding=None) -> tuple[ir.Module, tuple | None]:
    """The program one IPU runs, for a module over several partitions, and
    its layout: (per argument, per result: (mesh axes, mesh device ids,
    per dimension the mesh axes splitting it, unreduced axes)); None for
    one partition. inspect_sharding(backend_config, layout entry) is
    called for each jax.debug.inspect_array_sharding in the program."""
    if module.num_partitions == 1:
        return module, None
    if module.num_replicas != 1:
        raise IpuUnimplementedError(f"program {module.name}: {module.num_replicas} replicas x "
                                    f"{module.num_partitions} partitions is not supported; use one of them")
    return Partitioner(module, inspect_sharding).run()
