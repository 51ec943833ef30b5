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

import ctypes
import struct

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
        at = dict(zip(all_names, coords, strict=False))
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


class _InspectArgs(ctypes.Structure):
    """JAX_InspectSharding_Callback_Args (xla/python/inspect_sharding.h)."""
    _fields_ = [("sharding_spec", ctypes.c_char_p), ("sharding_spec_size", ctypes.c_size_t),
                ("error_txt", ctypes.c_char_p), ("error_scratch", ctypes.c_void_p),
                ("free_error", ctypes.c_void_p)]


_INSPECT_CALL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_InspectArgs))
_FREE_ERROR = ctypes.CFUNCTYPE(None, ctypes.POINTER(_InspectArgs))
_TRAMPOLINE: list = []


def inspect_sharding(config: bytes, entry) -> None:
    """Tells jax.debug.inspect_array_sharding's callback the sharding of
    its operand, as XLA's partitioner does: the custom call's
    backend_config holds JAX's {call, data} pair (16 bytes). Only a pair
    whose function is jaxlib's own trampoline is called (read from a pair
    jaxlib encodes here), so a program from elsewhere cannot make the
    plugin call an arbitrary address."""
    from jax._src.lib import xla_client as xc

    if not _TRAMPOLINE:
        _TRAMPOLINE.append(xc.encode_inspect_sharding_callback(lambda s: None)[:8])
    if len(config) != 16 or config[:8] != _TRAMPOLINE[0]:
        return
    function, data = struct.unpack("<QQ", config)
    spec = op_sharding(entry)
    args = _InspectArgs(spec, len(spec), None, None, None)
    _INSPECT_CALL(function)(data, ctypes.byref(args))
    if args.error_txt:
        message = args.error_txt.decode(errors="replace")
        if args.free_error:
            _FREE_ERROR(args.free_error)(ctypes.byref(args))
        raise RuntimeError(f"jax.debug.inspect_array_sharding's callback failed: {message}")
