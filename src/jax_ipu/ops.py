"""The element-wise ops: one record each, read by the compiler (fusion,
constant folding, cycle costs), the Model (its chain executors and their
XLA:CPU path) and the tests.

A record gives the op's semantics on numpy values, as XLA defines them
(integer division truncates; x / 0 is -1 signed and all-ones unsigned;
remainder takes the dividend's sign; out-of-range shifts; saturating
float -> int conversion), its jax.lax reference, whether it is
transcendental, its issue cycles per vector on a tile's worker (per
element for integers; see docs/ipu.md), and whether numpy runs it at
memory speed (SIMD, one pass).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from jax_ipu import ops_complex
from jax_ipu.targets import BFLOAT16, COMPLEX64


def _unsigned(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"u{dtype.itemsize}")


def _signed(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"i{dtype.itemsize}")


def _int_divide(a, b, dtype, attrs):
    zero = b == 0
    safe = np.where(zero, 1, b).astype(dtype)
    q = np.floor_divide(a, safe)
    if dtype.kind == "i":
        q = q + (((a % safe) != 0) & ((a < 0) != (safe < 0))).astype(dtype)
    return np.where(zero, np.array(-1).astype(dtype), q)


def _int_remainder(a, b, dtype, attrs):
    zero = b == 0
    return np.where(zero, a, np.fmod(a, np.where(zero, 1, b).astype(dtype)))


def _float_power(base, exponent, dtype):
    """np.power, except where numpy's float32 loop takes a scalar (or
    stride-0) exponent of 0.5 as a square root: sqrt(-inf) is NaN and
    sqrt(-0.0) is -0.0, where pow (XLA, C99) gives +inf and +0."""
    result = np.power(base, exponent)
    exponent = np.asarray(exponent)
    if dtype == np.float32 and (exponent.ndim == 0 or 0 in exponent.strides) and (exponent == 0.5).any():
        fix = (exponent == 0.5) & ((base == -np.inf) | (base == 0))
        if fix.any():
            result = np.where(fix, np.where(base == 0, np.float32(0), np.float32(np.inf)), result).astype(dtype)
    return result


def _power(base, exponent, dtype, attrs):
    if dtype.kind == "f":
        return _float_power(base, exponent, dtype)
    return _int_power(base, exponent, dtype, attrs)


def _int_power(base, exponent, dtype, attrs):
    """Square-and-multiply over the exponent's bits; negative exponents give
    0 except for bases 1 and -1, as XLA."""
    base, exponent = np.broadcast_arrays(base, exponent)
    result = np.ones(base.shape, dtype)
    b = base.copy()
    e = exponent.copy()
    if dtype.kind == "i":
        negative = e < 0
        e = np.where(negative, 0, e)
    for _ in range(dtype.itemsize * 8):
        if not e.any():
            break
        result = np.where(e & 1, result * b, result)
        b = b * b
        e = e >> 1
    if dtype.kind == "i":
        odd = (exponent & 1).astype(bool)
        at_negative = np.where(base == 1, 1, np.where(base == -1, np.where(odd, -1, 1), 0))
        result = np.where(negative, at_negative.astype(dtype), result)
    return result


def _sign(a, dtype, attrs):
    if dtype.kind == "f":
        # np.sign(-0.0) is +0.0; XLA keeps the zero's sign (and NaN).
        return np.copysign(np.sign(a), a).astype(dtype, copy=False)
    return np.sign(a).astype(dtype)


def _round_afz(a, dtype, attrs):
    r = np.trunc(a)
    return np.where(np.abs(a - r) >= 0.5, r + np.sign(a), r).astype(dtype)


def _shift_amount(b, dtype):
    """(amount as unsigned, whether it is out of range)."""
    amount = b.astype(dtype).view(_unsigned(dtype))
    bits = dtype.itemsize * 8
    return np.minimum(amount, bits - 1).astype(_unsigned(dtype)), amount >= bits


def _shift_left(a, b, dtype, attrs):
    amount, out = _shift_amount(b, dtype)
    return np.where(out, np.zeros((), dtype), np.left_shift(a, amount.astype(dtype)))


def _shift_right_logical(a, b, dtype, attrs):
    amount, out = _shift_amount(b, dtype)
    u = np.asarray(a).astype(dtype, copy=False).view(_unsigned(dtype))
    shifted = np.right_shift(u, amount).view(dtype)
    return np.where(out, np.zeros((), dtype), shifted)


def _shift_right_arithmetic(a, b, dtype, attrs):
    amount, _ = _shift_amount(b, dtype)   # beyond the width, the sign fills
    s = np.asarray(a).astype(dtype).view(_signed(dtype))
    return np.right_shift(s, amount.astype(_signed(dtype))).view(dtype)


def _popcnt(a, dtype, attrs):
    # numpy counts the bits of |a| for signed types; XLA of the two's complement.
    return np.bitwise_count(np.asarray(a).astype(dtype, copy=False).view(_unsigned(dtype))).astype(dtype)


def _count_leading_zeros(a, dtype, attrs):
    u = np.asarray(a).astype(dtype).view(_unsigned(dtype)).astype(np.float64)
    _, exponent = np.frexp(u)      # u = m * 2**exponent, m in [0.5, 1); 0 -> exponent 0
    return (dtype.itemsize * 8 - exponent).astype(dtype)


def _rsqrt(a, dtype, attrs):
    return np.reciprocal(np.sqrt(a))


def _logistic(a, dtype, attrs):
    one = np.ones((), dtype)
    return (one / (one + np.exp(-a))).astype(dtype)


def _is_finite(a, dtype, attrs):
    return np.isfinite(a)


def _clamp(lo, x, hi, dtype, attrs):
    return np.minimum(np.maximum(x, lo), hi)


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# From this many elements a select picks bits with masks: np.where branches
# on each element and mispredicts on a random predicate.
MASKED_SELECT = 1024


def _select(pred, on_true, on_false, dtype, attrs):
    p, t, f = np.asarray(pred), np.asarray(on_true), np.asarray(on_false)
    if (p.size < MASKED_SELECT or p.dtype != np.bool_ or t.dtype != dtype or f.dtype != dtype
            or dtype.itemsize not in _BITS):
        return np.where(p, t, f).astype(dtype, copy=False)
    # f ^ ((t ^ f) * pred), in unsigned integers of the element's width: the
    # chosen operand's bits (pred's bytes are 0 or 1, widened inside the
    # multiply's loop: one pass, against two to make a mask of ones and a
    # third to apply it).
    bits = _BITS[dtype.itemsize]
    flag = p.view(np.uint8)
    # The result in an array of its own (base None), which a chain keeps
    # as its output without copying it.
    out = np.empty(np.broadcast_shapes(p.shape, t.shape, f.shape), dtype)
    if f.size == 1 and not f.view(bits).any():       # select(p, x, 0), e.g. relu's gradient
        np.multiply(t.view(bits), flag, out=out.view(bits), dtype=bits)
        return out
    fb = f.view(bits)
    picked = np.multiply(np.bitwise_xor(t.view(bits), fb), flag, dtype=bits)
    np.bitwise_xor(picked, fb, out=out.view(bits))
    return out


def total_order_key(a):
    """Floats as signed integers whose order is IEEE totalOrder
    (-NaN < -inf < ... < -0 < +0 < ... < inf < NaN)."""
    i = np.asarray(a).view(_signed(a.dtype))
    mask = np.array(np.iinfo(i.dtype).max, dtype=i.dtype)
    return np.where(i < 0, i ^ mask, i)


_COMPARISONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                "GT": np.greater, "GE": np.greater_equal}


def _compare(a, b, dtype, attrs):
    direction = _COMPARISONS[attrs["comparison_direction"]]
    if attrs.get("compare_type") == "TOTALORDER" and np.asarray(a).dtype.kind == "f":
        return direction(total_order_key(np.asarray(a)), total_order_key(np.asarray(b)))
    return direction(a, b)


def _convert(a, dtype, attrs):
    a = np.asarray(a)
    if dtype == np.bool_:
        return a != 0
    if a.dtype.kind == "f" and dtype.kind in "iu":
        # XLA:CPU saturates, and sends NaN to 0.
        info = np.iinfo(dtype)
        wide = np.nan_to_num(np.trunc(a.astype(np.float64)), nan=0.0)
        return np.clip(wide, info.min, info.max).astype(dtype)
    return a.astype(dtype)


def _bitcast_convert(a, dtype, attrs):
    # A copy, not a view: a chain reuses its registers as `out` buffers, and
    # writing into a view would overwrite the operand (the caller's input).
    # np.array(order="C") keeps a 0-d operand 0-d.
    a = np.asarray(a)
    return np.array(a, order="C", copy=True).view(dtype).reshape(a.shape)


def _reduce_precision(a, dtype, attrs):
    """Rounds to the nearest value (ties to even) with `mantissa_bits` and
    `exponent_bits`, as XLA: overflow goes to infinity, values below the
    smallest normal to zero, NaN stays NaN."""
    x = np.asarray(a)
    finfo = np.finfo(x.dtype)
    src_mantissa, src_exponent = finfo.nmant, finfo.nexp
    mantissa, exponent = int(attrs["mantissa_bits"]), int(attrs["exponent_bits"])
    u = _unsigned(x.dtype)
    nbits = 8 * x.dtype.itemsize
    bits = np.ascontiguousarray(x).view(u).reshape(x.shape).astype(np.uint64)
    if mantissa < src_mantissa:
        last = np.uint64(1 << (src_mantissa - mantissa))
        bias = (bits & last) // last + np.uint64((int(last) >> 1) - 1)
        bits = (bits + bias) & np.uint64(~(int(last) - 1) & ((1 << nbits) - 1))
    if exponent < src_exponent:
        sign = bits & np.uint64(1 << (nbits - 1))
        exp_mask = np.uint64(((1 << src_exponent) - 1) << src_mantissa)
        exp_bias = (1 << (src_exponent - 1)) - 1
        reduced_bias = (1 << (exponent - 1)) - 1
        exps = bits & exp_mask
        overflow = exps > np.uint64((exp_bias + reduced_bias) << src_mantissa)
        underflow = exps <= np.uint64((exp_bias - reduced_bias) << src_mantissa)
        bits = np.where(overflow, sign | exp_mask, np.where(underflow, sign, bits))
    out = np.asarray(bits).astype(u).view(x.dtype).reshape(x.shape)
    return np.where(np.isnan(x), x, out).astype(dtype)


def _lax_compare(lax):
    def compare(a, b, *, comparison_direction, compare_type=None):
        if compare_type == "TOTALORDER":
            raise NotImplementedError("total-order compare")
        return {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt,
                "GE": lax.ge}[comparison_direction](a, b)
    return compare


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    arity: int
    # The element types it takes, as numpy kinds: f float (bfloat16 too,
    # computed in float32), c complex (ops_complex), i signed and u
    # unsigned integer, b bool (compare, select, clamp, convert, bitcast:
    # every type).
    kinds: str
    # fn(lax module) -> the jax.lax function computing the op (keyword
    # attributes as the op's StableHLO attributes); XLA:CPU is the reference.
    lax: Callable
    # numpy ufunc computing the op on operands of every dtype, or None.
    ufunc: np.ufunc | None = None
    # numpy ufunc for float operands only (the integer case is `function`).
    float_ufunc: np.ufunc | None = None
    # fn(*operands, dtype=result dtype, attrs=dict) where no ufunc applies.
    function: Callable | None = None
    transcendental: bool = False
    cycles_per_vector: int = 1
    fast_in_numpy: bool = False


def _round(method):
    return lambda lax: (lambda x: lax.round(x, getattr(lax.RoundingMethod, method)))


_RECORDS = [
    # name, arity, lax, semantics, flags and cost
    Op("add", 2, "fiuc", lambda lax: lax.add, ufunc=np.add, fast_in_numpy=True),
    Op("subtract", 2, "fiuc", lambda lax: lax.sub, ufunc=np.subtract, fast_in_numpy=True),
    Op("multiply", 2, "fiuc", lambda lax: lax.mul, ufunc=np.multiply, fast_in_numpy=True),
    Op("divide", 2, "fiuc", lambda lax: lax.div, float_ufunc=np.divide, function=_int_divide, cycles_per_vector=4),
    Op("remainder", 2, "fiu", lambda lax: lax.rem, float_ufunc=np.fmod, function=_int_remainder, cycles_per_vector=8),
    Op("power", 2, "fc", lambda lax: lax.pow, function=_power, transcendental=True, cycles_per_vector=20),
    Op("maximum", 2, "fiub", lambda lax: lax.max, ufunc=np.maximum, fast_in_numpy=True),
    Op("minimum", 2, "fiub", lambda lax: lax.min, ufunc=np.minimum, fast_in_numpy=True),
    Op("atan2", 2, "f", lambda lax: lax.atan2, ufunc=np.arctan2, transcendental=True, cycles_per_vector=20),
    Op("negate", 1, "fic", lambda lax: lax.neg, ufunc=np.negative, fast_in_numpy=True),
    Op("abs", 1, "fic", lambda lax: lax.abs, ufunc=np.absolute, fast_in_numpy=True),
    Op("sign", 1, "fic", lambda lax: lax.sign, function=_sign),
    Op("floor", 1, "f", lambda lax: lax.floor, ufunc=np.floor, fast_in_numpy=True),
    Op("ceil", 1, "f", lambda lax: lax.ceil, ufunc=np.ceil, fast_in_numpy=True),
    Op("round_nearest_even", 1, "f", _round("TO_NEAREST_EVEN"), ufunc=np.rint, fast_in_numpy=True),
    Op("round_nearest_afz", 1, "f", _round("AWAY_FROM_ZERO"), function=_round_afz, cycles_per_vector=2),
    Op("sqrt", 1, "fc", lambda lax: lax.sqrt, ufunc=np.sqrt, transcendental=True, cycles_per_vector=4,
       fast_in_numpy=True),
    Op("rsqrt", 1, "fc", lambda lax: lax.rsqrt, function=_rsqrt, transcendental=True, cycles_per_vector=4,
       fast_in_numpy=True),
    Op("cbrt", 1, "f", lambda lax: lax.cbrt, ufunc=np.cbrt, transcendental=True, cycles_per_vector=20),
    Op("exponential", 1, "fc", lambda lax: lax.exp, ufunc=np.exp, transcendental=True, cycles_per_vector=8),
    Op("exponential_minus_one", 1, "fc", lambda lax: lax.expm1, ufunc=np.expm1, transcendental=True,
       cycles_per_vector=10),
    Op("log", 1, "fc", lambda lax: lax.log, ufunc=np.log, transcendental=True, cycles_per_vector=8),
    Op("log_plus_one", 1, "fc", lambda lax: lax.log1p, ufunc=np.log1p, transcendental=True, cycles_per_vector=10),
    Op("logistic", 1, "fc", lambda lax: lax.logistic, function=_logistic, transcendental=True, cycles_per_vector=10),
    Op("tanh", 1, "fc", lambda lax: lax.tanh, ufunc=np.tanh, transcendental=True, cycles_per_vector=8),
    Op("sine", 1, "fc", lambda lax: lax.sin, ufunc=np.sin, transcendental=True, cycles_per_vector=12),
    Op("cosine", 1, "fc", lambda lax: lax.cos, ufunc=np.cos, transcendental=True, cycles_per_vector=12),
    Op("tan", 1, "fc", lambda lax: lax.tan, ufunc=np.tan, transcendental=True, cycles_per_vector=16),
    Op("is_finite", 1, "f", lambda lax: lax.is_finite, function=_is_finite, fast_in_numpy=True),
    Op("not", 1, "iub", lambda lax: lax.bitwise_not, ufunc=np.invert, fast_in_numpy=True),
    Op("and", 2, "iub", lambda lax: lax.bitwise_and, ufunc=np.bitwise_and, fast_in_numpy=True),
    Op("or", 2, "iub", lambda lax: lax.bitwise_or, ufunc=np.bitwise_or, fast_in_numpy=True),
    Op("xor", 2, "iub", lambda lax: lax.bitwise_xor, ufunc=np.bitwise_xor, fast_in_numpy=True),
    Op("shift_left", 2, "iu", lambda lax: lax.shift_left, function=_shift_left),
    Op("shift_right_logical", 2, "iu", lambda lax: lax.shift_right_logical, function=_shift_right_logical),
    Op("shift_right_arithmetic", 2, "iu", lambda lax: lax.shift_right_arithmetic, function=_shift_right_arithmetic),
    Op("popcnt", 1, "iu", lambda lax: lax.population_count, function=_popcnt, cycles_per_vector=2),
    Op("count_leading_zeros", 1, "iu", lambda lax: lax.clz, function=_count_leading_zeros, cycles_per_vector=2),
    Op("compare", 2, "fiubc", _lax_compare, function=_compare, fast_in_numpy=True),
    Op("select", 3, "fiubc", lambda lax: lax.select, function=_select, fast_in_numpy=True),
    Op("clamp", 3, "fiub", lambda lax: lax.clamp, function=_clamp, fast_in_numpy=True),
    Op("convert", 1, "fiubc", lambda lax: lax.convert_element_type, function=_convert),
    Op("bitcast_convert", 1, "fiubc", lambda lax: lax.bitcast_convert_type, function=_bitcast_convert),
    Op("real", 1, "c", lambda lax: lax.real, function=ops_complex.real, fast_in_numpy=True),
    Op("imag", 1, "c", lambda lax: lax.imag, function=ops_complex.imag, fast_in_numpy=True),
    Op("complex", 2, "f", lambda lax: lax.complex, function=ops_complex.complex_, fast_in_numpy=True),
    Op("reduce_precision", 1, "f", lambda lax: (lambda x, *, exponent_bits, mantissa_bits: lax.reduce_precision(
        x, int(exponent_bits), int(mantissa_bits))), function=_reduce_precision),
]
OPS: dict[str, Op] = {op.name: op for op in _RECORDS}
ELEMENTWISE_OPS = frozenset(OPS)
TRANSCENDENTAL = frozenset(name for name, op in OPS.items() if op.transcendental)
# Chains of these alone run at memory speed in numpy ("constant": a chain's
# immediate, materialised once).
FAST_IN_NUMPY = frozenset(name for name, op in OPS.items() if op.fast_in_numpy) | {"constant"}
# The ops a reduction (or a collective's, or a scatter's combiner) applies
# by itself, without a body program: each one's numpy ufunc, whose reduce
# and accumulate the Model uses. A reduction whose body is one of these on
# its two arguments is lowered to them (compiler/lowering/reduce.py).
REDUCE_OPS: dict[str, np.ufunc] = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum,
                                   "minimum": np.minimum, "and": np.bitwise_and, "or": np.bitwise_or,
                                   "xor": np.bitwise_xor}


# The element-wise ops defined on complex64 (ops_complex): arithmetic, the
# transcendental functions XLA defines on complex numbers, EQ and NE, the
# parts, and the moves.
COMPLEX_OPS = frozenset(name for name, op in OPS.items() if "c" in op.kinds) | {"complex"}
# Ops that move bits, whatever the type: never widened.
_MOVES = frozenset({"select", "bitcast_convert"})
_F32 = np.dtype(np.float32)


def emulates(op: str, operand_dtypes: Sequence[np.dtype], dtype: np.dtype) -> str | None:
    """The emulated type an element-wise op computes in ("bfloat16" or
    "complex64"), or None when the IPU runs it natively."""
    if op in _MOVES:
        return None
    types = set(operand_dtypes) | {np.dtype(dtype)}
    if COMPLEX64 in types or op in ("real", "imag", "complex"):
        return "complex64"
    if BFLOAT16 in types:
        return "bfloat16"
    return None


def implementation(op: str, operand_dtypes: Sequence[np.dtype], dtype: np.dtype,
                   attrs: dict) -> tuple[Callable, bool]:
    """fn(*operands) computing `op` on operands of `operand_dtypes` into
    `dtype` as the IPU does, and whether fn is a numpy ufunc taking `out`.
    bfloat16 operands are widened to float32, the float32 op runs, and a
    bfloat16 result is rounded to nearest even (NaN stays a quiet NaN), as
    XLA:CPU normalizes bfloat16 ops; complex64 ops are ops_complex's."""
    operand_dtypes = [np.dtype(d) for d in operand_dtypes]
    dtype = np.dtype(dtype)
    emulated = emulates(op, operand_dtypes, dtype)
    if emulated == "complex64":
        return _complex(op, operand_dtypes, dtype, attrs)
    if emulated == "bfloat16":
        return _widened(op, operand_dtypes, dtype, attrs), False
    ufunc = ufunc_for(op, operand_dtypes[0]) if operand_dtypes else None
    if ufunc is not None:
        return ufunc, True
    fn = function_for(op)
    return (lambda *a: fn(*a, dtype=dtype, attrs=attrs)), False


def _widened(op: str, operand_dtypes: list, dtype: np.dtype, attrs: dict) -> Callable:
    widen = [d == BFLOAT16 for d in operand_dtypes]
    fn, _ = implementation(op, [_F32 if w else d for d, w in zip(operand_dtypes, widen, strict=True)],
                           _F32 if dtype == BFLOAT16 else dtype, attrs)
    rounds = dtype == BFLOAT16

    def widened(*operands):
        result = fn(*[np.asarray(a).astype(_F32) if w else a for a, w in zip(operands, widen, strict=True)])
        return np.asarray(result).astype(BFLOAT16) if rounds else result
    return widened


def _complex(op: str, operand_dtypes: list, dtype: np.dtype, attrs: dict) -> tuple[Callable, bool]:
    if op in ops_complex.BY_PARTS:
        return ops_complex.BY_PARTS[op], True
    if op == "convert":
        return _convert_complex(operand_dtypes[0], dtype, attrs), False
    function = ops_complex.FUNCTIONS.get(op)
    if function is None:
        raise ValueError(f"stablehlo.{op} is not defined on complex numbers")
    return (lambda *a: function(*a, dtype, attrs)), False


def _convert_complex(source: np.dtype, dtype: np.dtype, attrs: dict) -> Callable:
    """convert to complex64 (the real part converted to float32, the
    imaginary part zero) or from it (its real part converted; to bool:
    whether it is nonzero)."""
    if dtype == COMPLEX64:
        to_f32, _ = implementation("convert", [source], _F32, attrs) if source != COMPLEX64 else (None, False)
        return (lambda a: np.array(a, dtype=COMPLEX64)) if to_f32 is None else \
            (lambda a: ops_complex.pair(to_f32(a), 0.0))
    if dtype == np.bool_:
        return lambda a: np.asarray(a) != 0
    from_f32, _ = implementation("convert", [_F32], dtype, attrs)
    return lambda a: from_f32(ops_complex.parts(a)[0])


def ufunc_for(op: str, operand_dtype: np.dtype) -> np.ufunc | None:
    """The ufunc computing `op` on operands of this dtype, if it is one."""
    record = OPS[op]
    if record.ufunc is not None:
        return record.ufunc
    if operand_dtype.kind == "f":
        return record.float_ufunc
    return None


def function_for(op: str) -> Callable:
    """fn(*operands, dtype, attrs) for ops that are not a plain ufunc."""
    return OPS[op].function


def cycles_per_vector(ops) -> int:
    """Issue cycles per vector of a chain of these ops on one worker."""
    return sum(OPS[op].cycles_per_vector if op in OPS else 1 for op in ops)
