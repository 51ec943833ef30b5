"""An executable's argument and result shardings as serialized xla.OpSharding
protos, for PJRT's shardings extension: JAX reads them to know how to
split the inputs it was not told about and how the results are laid out,
and checks them against the shardings it asked for.

A layout (from the compiler's SPMD pass) is (per argument, per result):
(mesh axes ((name, size), ...), the partition at each mesh position or
None for in order, per dimension the mesh axes splitting it, the axes
holding partial sums). Tile assignment entries are partition indices,
which JAX maps through the executable's device assignment."""
from __future__ import annotations

import numpy as np


def op_sharding(entry) -> bytes:
    from jax._src.lib import xla_client as xc

    proto = xc.OpSharding()
    if entry is None:
        proto.type = xc.OpSharding.Type.REPLICATED
        return proto.SerializeToString()
    axes, device_ids, dims, unreduced = entry
    names = [a for a, s in axes if s > 1]
    sizes = dict(axes)
    dims = [tuple(a for a in d if sizes[a] > 1) for d in dims]
    unreduced = [a for a in names if a in unreduced]
    used = {a for d in dims for a in d}
    copies = [a for a in names if a not in used and a not in unreduced]
    if not used and not unreduced:
        proto.type = xc.OpSharding.Type.REPLICATED
        return proto.SerializeToString()
    # Tile dimensions, then one per kind of sub-group: copies, partial sums
    # (in OpSharding.Type order, as JAX writes them).
    groups = [tuple(d) for d in dims]
    kinds = []
    for kind, members in ((xc.OpSharding.Type.REPLICATED, copies), (xc.OpSharding.Type.UNREDUCED, unreduced)):
        if members:
            groups.append(tuple(members))
            kinds.append(kind)
    shape = [int(np.prod([sizes[a] for a in g], dtype=np.int64)) for g in groups]
    ids = np.arange(int(np.prod([s for _, s in axes], dtype=np.int64))) if device_ids is None else np.asarray(
        device_ids)
    ids = ids.reshape([s for _, s in axes])
    assignment = np.empty(shape, dtype=np.int64)
    all_names = [a for a, _ in axes]
    for coords in np.ndindex(*ids.shape):
        at = dict(zip(all_names, coords))
        assignment[tuple(int(np.ravel_multi_index([at[a] for a in g], [sizes[a] for a in g])) if g else 0
                         for g in groups)] = ids[coords]
    proto.type = xc.OpSharding.Type.OTHER
    proto.tile_assignment_dimensions = shape
    proto.tile_assignment_devices = [int(d) for d in assignment.ravel()]
    if kinds == [xc.OpSharding.Type.REPLICATED]:
        proto.replicate_on_last_tile_dim = True
    elif kinds:
        proto.last_tile_dims = kinds
    return proto.SerializeToString()


def executable_shardings(layout, num_params: int, num_outputs: int):
    """(argument protos, result protos), each None when unknown."""
    if layout is None:
        return None, None
    args, results = layout
    params = [op_sharding(e) for e in args] if len(args) == num_params else None
    # (None, not [], for a program with no outputs: JAX reads an empty list
    # as shardings that do not match its empty result tuple.)
    outputs = [op_sharding(e) for e in results] if len(results) == num_outputs and num_outputs else None
    return params, outputs
