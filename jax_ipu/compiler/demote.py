"""The opt-in policy JAX_IPU_F64_AS_F32 (CompileOptions.f64_policy
"as_f32"): 64-bit types run as their 32-bit siblings, as PopTorch does.

float64 becomes float32, int64 int32 and uint64 uint32, everywhere in the
program: arguments, results, every op's values. JAX still sees 64-bit
arrays; the buffers convert on the way to and from the device. Constants
are rounded (floats, IEEE) or clamped (integers: int64's limits, which JAX
uses as sentinels, become int32's). Integer arithmetic then wraps at 32
bits. Ops whose meaning depends on the bit width cannot be kept that way
and are refused, naming the op: bitcast_convert of a 64-bit type (e.g.
jax.random's float64 sampling builds floats from 64 random bits),
count_leading_zeros and popcnt of 64-bit integers, and shifts of 64-bit
integers by a constant of 32 or more (jax.random's int64 samplers join two
32-bit words so). complex128 stays refused (the IPU has no complex type)."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.model.targets import AS_32

_BIT_LEVEL = {"bitcast_convert", "count_leading_zeros", "popcnt"}
_SHIFTS = {"shift_left", "shift_right_logical", "shift_right_arithmetic"}
_SAME_VALUES = {"broadcast_in_dim", "reshape", "convert"}


def demote_64bit(module: ir.Module) -> None:
    """Rewrites the module's 64-bit types in place (values are shared, so
    each is retyped once)."""
    seen: set[int] = set()
    for function in module.functions.values():
        _block(function.body, seen)


def _retype(values, seen: set) -> bool:
    """Retypes `values`; True if any was 64-bit."""
    wide = False
    for v in values:
        if isinstance(v.type, ir.TensorType) and v.type.dtype in AS_32:
            wide = True
            if id(v) not in seen:
                seen.add(id(v))
                v.type = ir.TensorType(v.type.shape, AS_32[v.type.dtype])
        elif id(v) in seen:
            wide = True
    return wide


def _block(block: ir.Block, seen: set) -> None:
    _retype(block.args, seen)
    largest: dict[ir.Value, int] = {}      # integer constants (and their broadcasts): the largest element
    for op in block.ops:
        wide = _retype(op.operands, seen) | _retype(op.results, seen)
        shift = op.name in _SHIFTS and largest.get(op.operands[1], 0) >= 32
        if wide and (op.name in _BIT_LEVEL or shift):
            what = "it shifts a 64-bit integer by 32 bits or more" if shift else "it works on the bits of a 64-bit value"
            raise IpuUnimplementedError.for_op(
                op, f"{what}, which JAX_IPU_F64_AS_F32 runs as a 32-bit one",
                "Use 32-bit types for this computation (e.g. dtype=jnp.float32 or jnp.int32 for jax.random "
                "samplers), or turn JAX_IPU_F64_AS_F32 off")
        if op.name == "constant":
            value = np.asarray(op.attrs["value"])
            if value.dtype.kind in "iu" and value.size:
                largest[op.results[0]] = int(value.max())
            if wide:
                op.attrs = {**op.attrs, "value": _narrow(value, op.results[0].type.dtype)}
        elif op.name in _SAME_VALUES and op.operands[0] in largest:
            largest[op.results[0]] = largest[op.operands[0]]
        for region in op.regions:
            _block(region, seen)


def _narrow(value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype.kind in "iu" and value.dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(value, info.min, info.max).astype(dtype)
    return value.astype(dtype)
