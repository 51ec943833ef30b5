"""An executable's argument and result shardings as serialized xla.OpSharding
protos, for PJRT's shardings extension: JAX reads them to know how to
split the inputs it was not told about and how the results are laid out.

A layout (from compiler.spmd) is (mesh, argument dims, result dims): mesh
((axis, size), ...) in partition order, and per value, per dimension, the
mesh axes splitting it. Tile assignment entries are partition indices,
which JAX maps through the executable's device assignment."""
from __future__ import annotations

import numpy as np


def op_sharding(mesh, dims) -> bytes:
    from jax._src.lib import xla_client as xc

    names = [a for a, _ in mesh]
    sizes = dict(mesh)
    proto = xc.OpSharding()
    if dims is None or not any(dims):
        proto.type = xc.OpSharding.Type.REPLICATED
        return proto.SerializeToString()
    used = {a for axes in dims for a in axes}
    unused = [a for a in names if a not in used and sizes[a] > 1]
    tiles = [int(np.prod([sizes[a] for a in axes], dtype=np.int64)) for axes in dims]
    replicas = int(np.prod([sizes[a] for a in unused], dtype=np.int64))
    groups = [tuple(axes) for axes in dims] + ([tuple(unused)] if replicas > 1 else [])
    shape = tiles + ([replicas] if replicas > 1 else [])
    assignment = np.empty(shape, dtype=np.int64)
    for p, coords in enumerate(np.ndindex(*[s for _, s in mesh])):
        at = dict(zip(names, coords, strict=True))
        assignment[tuple(int(np.ravel_multi_index([at[a] for a in g], [sizes[a] for a in g])) if g else 0
                         for g in groups)] = p
    proto.type = xc.OpSharding.Type.OTHER
    proto.tile_assignment_dimensions = shape
    proto.tile_assignment_devices = [int(d) for d in assignment.ravel()]
    proto.replicate_on_last_tile_dim = replicas > 1
    return proto.SerializeToString()


def executable_shardings(layout, num_params: int, num_outputs: int):
    """(argument protos, result protos), each None when unknown."""
    if layout is None:
        return None, None
    mesh, args, results = layout
    params = [op_sharding(mesh, d) for d in args] if len(args) == num_params else None
    # (None, not [], for a program with no outputs: JAX reads an empty list
    # as shardings that do not match its empty result tuple.)
    outputs = [op_sharding(mesh, d) for d in results] if len(results) == num_outputs and num_outputs else None
    return params, outputs
