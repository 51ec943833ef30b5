"""The opt-in policy JAX_IPU_F64_AS_F32 (CompileOptions.f64_policy
"as_f32"): 64-bit types run as their 32-bit siblings, as PopTorch does.

float64 becomes float32, int64 int32, uint64 uint32 and complex128
complex64 (itself emulated as pairs of float32), everywhere in the
program: arguments, results, every op's values. JAX still sees 64-bit
arrays; the buffers convert on the way to and from the device. Constants
are rounded (floats, IEEE); integer ones keep their low 32 bits when they
fit a 32-bit pattern, int64's limits (JAX's sentinels) become int32's, and
others beyond 32 bits are refused, naming the op. Integer arithmetic then
wraps at 32 bits. Ops whose meaning depends on the bit width cannot be kept
that way and are refused, naming the op: bitcast_convert of a 64-bit type
(e.g. jax.random's float64 sampling builds floats from 64 random bits),
count_leading_zeros and popcnt of 64-bit integers, and shifts of 64-bit
integers by a constant array holding 32 or more (jax.random's int64
samplers join two 32-bit words so) or by an amount computed at run time."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.targets import AS_32

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


def _block(block: ir.Block, seen: set, refused: dict | None = None) -> None:
    _retype(block.args, seen)
    largest: dict[ir.Value, int] = {}      # integer constants (and their broadcasts): the largest element
    splat: dict[ir.Value, int] = {}        # ... whose elements are all one value (before narrowing)
    producer: dict[ir.Value, ir.Op] = {}
    ops: list[ir.Op] = []
    # Constants beyond 32 bits: refused at their first reader, in any region.
    refused = {} if refused is None else refused        # value -> (problem, advice)
    for op in block.ops:
        reads_refused = next((refused[v] for v in op.operands if v in refused), None)
        if reads_refused is not None:
            # (JAX gives hoisted constants the jit call's line, their readers the user's.)
            raise IpuUnimplementedError.for_op(op, *reads_refused)
        signed = [isinstance(v.type, ir.TensorType) and v.type.dtype.kind == "i" for v in op.operands]
        wide = _retype(op.operands, seen) | _retype(op.results, seen)
        rewritten = _rewrite(op, splat, producer, signed) if wide else None
        if rewritten is not None:
            ops.extend(rewritten)
            continue
        shift = op.name in _SHIFTS and largest.get(op.operands[1], 0) >= 32 and op.operands[1] not in splat
        # An amount computed at run time may be 32 or more: a 32-bit shift gives another answer.
        runtime_shift = op.name in _SHIFTS and op.operands[1] not in largest
        if wide and (op.name in _BIT_LEVEL or shift or runtime_shift):
            what = ("it shifts a 64-bit integer by 32 bits or more" if shift else
                    "it shifts a 64-bit integer by an amount known only at run time (32 or more would "
                    "differ)" if runtime_shift else "it works on the bits of a 64-bit value")
            raise IpuUnimplementedError.for_op(
                op, f"{what}, which JAX_IPU_F64_AS_F32 runs as a 32-bit one",
                "Use 32-bit types for this computation (e.g. dtype=jnp.float32 or jnp.int32 for jax.random "
                "samplers), or turn JAX_IPU_F64_AS_F32 off")
        if op.name == "constant":
            value = np.asarray(op.attrs["value"])
            if value.dtype.kind in "iu" and value.size:
                largest[op.results[0]] = int(value.max())
                if value.min() == value.max():
                    splat[op.results[0]] = int(value.max())
            if wide:
                narrowed = _narrow(value, op.results[0].type.dtype)
                if isinstance(narrowed, tuple):
                    refused[op.results[0]] = narrowed
                else:
                    op.attrs = {**op.attrs, "value": narrowed}
        elif op.name in _SAME_VALUES and op.operands[0] in largest:
            largest[op.results[0]] = largest[op.operands[0]]
            if op.operands[0] in splat:
                splat[op.results[0]] = splat[op.operands[0]]
        for region in op.regions:
            _block(region, seen, refused)
        for r in op.results:
            producer[r] = op
        ops.append(op)
    for v in block.results:
        if v in refused:
            raise IpuUnimplementedError("a result of the program: {}. {}".format(*refused[v]))
    block.ops[:] = ops


# float64(1.0)'s bits: jax.random builds float64 uniforms in [1, 2) as
# bitcast(bits >> 12 | ONE_F64) (52 mantissa bits of 64 random ones).
_ONE_F64 = int(np.array(1.0, np.float64).view(np.uint64))
_ONE_F32 = int(np.array(1.0, np.float32).view(np.uint32))


def _rewrite(op: ir.Op, splat: dict, producer: dict, signed: list[bool]) -> list[ir.Op] | None:
    """The 32-bit ops that keep a 64-bit op's meaning for values that fit 32
    bits (as JAX_IPU_F64_AS_F32 keeps integers), or None to keep the op.

    - x >> k (logical, k >= 32) of a signed 64-bit x: the sign's ones
      shifted, (x >> 31 arithmetic) >> (k - 32) logical; an unsigned one,
      0 (the op as it is). Left shifts by 32 or more give 0 and arithmetic
      ones the sign, as their 32-bit siblings (jax.random.key(seed) splits
      an int64 seed so; its 64-bit samplers join two words with << 32).
    - jax.random's float64 uniform, bitcast(bits >> 12 | ONE_F64): the
      float32 one from the low 32 random bits, bitcast(bits >> 9 | ONE_F32)."""
    loc = op.loc

    def emit(name, operands, t, **attrs) -> ir.Value:
        value = ir.Value(t)
        out.append(ir.Op(name, list(operands), [value], attrs, [], loc))
        return value

    def full(value: int, like: ir.Value) -> ir.Value:
        t = like.type
        scalar = emit("constant", [], ir.TensorType((), t.dtype), value=np.array(value, t.dtype))
        return emit("broadcast_in_dim", [scalar], t, broadcast_dimensions=())

    out: list[ir.Op] = []
    result = op.results[0] if len(op.results) == 1 else None
    if op.name == "shift_right_logical" and signed[0] and splat.get(op.operands[1], 0) >= 32:
        x, k = op.operands[0], splat[op.operands[1]]
        sign = emit("shift_right_arithmetic", [x, full(31, x)], x.type)
        out.append(ir.Op("shift_right_logical", [sign, full(min(k - 32, 32), x)], [result], {}, [], loc))
        return out
    if op.name == "bitcast_convert" and result.type.dtype == np.float32:
        bits = producer.get(op.operands[0])
        if bits is None or bits.name != "or" or bits.operands[0].type.dtype != np.uint32:
            return None
        a, b = bits.operands
        if splat.get(a) == _ONE_F64:
            a, b = b, a
        shifted = producer.get(a)
        if (splat.get(b) != _ONE_F64 or shifted is None or shifted.name != "shift_right_logical"
                or splat.get(shifted.operands[1]) != 12):
            return None
        x = shifted.operands[0]
        mantissa = emit("shift_right_logical", [x, full(9, x)], x.type)
        ones = emit("or", [mantissa, full(_ONE_F32, x)], x.type)
        out.append(ir.Op("bitcast_convert", [ones], [result], op.attrs, [], loc))
        return out
    return None


# 64-bit constants beyond the 32-bit range that are clamped, not refused:
# int64's and uint64's limits (JAX's sentinels, e.g. argmin's), 2**32
# (jax.random.randint's 64-bit word base, as uint64) and float64(1.0)'s
# bits (jax.random's float64 uniform, which _rewrite replaces).
_CLAMPED = frozenset({-2**63, 2**63 - 1, 2**64 - 1, 2**32, _ONE_F64})


def _narrow(value: np.ndarray, dtype: np.dtype) -> np.ndarray | tuple[str, str]:
    """A 64-bit constant as its 32-bit sibling: a 32-bit pattern wraps (a
    mask such as 0xFFFFFFFF is -1 in an int32, as the arithmetic wraps);
    the values of _CLAMPED clamp; any other value beyond 32 bits is refused
    (a + 2**33 would silently become a + INT32_MAX): (problem, advice)."""
    if dtype.kind in "iu" and value.dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = (info.min, (1 << 32) - 1) if dtype.kind == "i" else (0, info.max)
        pattern = (value >= low) & (value <= high)
        if not pattern.all():
            beyond = {int(v) for v in np.unique(value[~pattern])}
            if not beyond <= _CLAMPED:
                shown = ", ".join(str(v) for v in sorted(beyond - _CLAMPED)[:3])
                return (f"the {value.dtype} constant {shown} does not fit 32 bits (JAX_IPU_F64_AS_F32 runs "
                        f"{value.dtype} as {dtype})",
                        "Keep integer constants within the int32/uint32 range (e.g. jax.random.randint bounds, "
                        "seeds), or turn JAX_IPU_F64_AS_F32 off")
        return np.where(pattern, value.astype(dtype), np.clip(value, info.min, info.max).astype(dtype))
    return value.astype(dtype)
