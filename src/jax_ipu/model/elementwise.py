"""The element-wise codelets' arithmetic, op by op, with XLA's semantics
(integer division truncates; x / 0 is -1 signed and all-ones unsigned;
remainder takes the dividend's sign; out-of-range shifts; saturating
float -> int conversion). Each entry: fn(*operands, dtype=result dtype,
attrs) -> array. Entries in UFUNCS may also write into an `out` buffer."""
from __future__ import annotations

import numpy as np

# Ops that are a plain numpy ufunc of their operands: the chain executor
# reuses dead temporaries as their `out` buffers.
UFUNCS: dict[str, np.ufunc] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "maximum": np.maximum, "minimum": np.minimum, "negate": np.negative, "abs": np.absolute,
    "floor": np.floor, "ceil": np.ceil, "round_nearest_even": np.rint, "sqrt": np.sqrt,
    "cbrt": np.cbrt, "exponential": np.exp, "exponential_minus_one": np.expm1, "log": np.log,
    "log_plus_one": np.log1p, "tanh": np.tanh, "sine": np.sin, "cosine": np.cos, "tan": np.tan,
    "atan2": np.arctan2, "not": np.invert, "and": np.bitwise_and, "or": np.bitwise_or,
    "xor": np.bitwise_xor,
}
# Float-only ufuncs; the same names on integers are in OPS below.
FLOAT_UFUNCS: dict[str, np.ufunc] = {"divide": np.divide, "remainder": np.fmod}


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
# on each element and costs 5 ns an element on a random predicate.
MASKED_SELECT = 1024


def _select(pred, on_true, on_false, dtype, attrs):
    p, t, f = np.asarray(pred), np.asarray(on_true), np.asarray(on_false)
    if (p.size < MASKED_SELECT or p.dtype != np.bool_ or t.dtype != dtype or f.dtype != dtype
            or dtype.itemsize not in _BITS):
        return np.where(p, t, f).astype(dtype, copy=False)
    # f ^ ((t ^ f) * pred), in unsigned integers of the element's width: the
    # chosen operand's bits (pred's bytes are 0 or 1, widened inside the
    # multiply's loop: one pass, against two to make a mask of ones and a
    # third to apply it, 42 -> 20 us for relu's gradient on 64K elements).
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


def _total_order_key(a):
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
        return direction(_total_order_key(np.asarray(a)), _total_order_key(np.asarray(b)))
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


OPS = {
    "reduce_precision": _reduce_precision,
    "divide": _int_divide, "remainder": _int_remainder, "power": _power, "sign": _sign,
    "round_nearest_afz": _round_afz, "rsqrt": _rsqrt, "logistic": _logistic,
    "is_finite": _is_finite, "clamp": _clamp, "select": _select, "compare": _compare,
    "convert": _convert, "bitcast_convert": _bitcast_convert, "shift_left": _shift_left,
    "shift_right_logical": _shift_right_logical, "shift_right_arithmetic": _shift_right_arithmetic,
    "popcnt": _popcnt, "count_leading_zeros": _count_leading_zeros,
}

ELEMENTWISE_OPS = frozenset(UFUNCS) | frozenset(FLOAT_UFUNCS) | frozenset(OPS)


def ufunc_for(op: str, operand_dtype: np.dtype) -> np.ufunc | None:
    """The ufunc computing `op` on operands of this dtype, if it is one."""
    if op in UFUNCS:
        return UFUNCS[op]
    if operand_dtype.kind == "f":
        return FLOAT_UFUNCS.get(op)
    return None


def function_for(op: str):
    """fn(*operands, dtype, attrs) for ops that are not a plain ufunc."""
    return OPS[op]
