"""The element-wise ops on complex64, as the IPU emulates them: a complex64
is a pair of float32 (real, imaginary), and every op is the sequence of
float32 ops XLA:CPU lowers it to (MLIR's complex-to-standard expansions:
Smith's division, the range-reduced absolute value, exp, log, sqrt, tanh
and their special cases for zeros, infinities and NaN), each float32 op
rounding as the IPU's does. XLA:CPU may contract a product and a sum into
one fused multiply-add (by the host) and flushes subnormal float32 values;
those are its only departures (docs/semantics.md).

Each function takes numpy arrays (or scalars) and returns the result's
array; `COMPONENTS` gives the float32 ops each one costs on a tile
(compiler/cost.py charges them)."""
from __future__ import annotations

import numpy as np

_F32 = np.dtype(np.float32)
_C64 = np.dtype(np.complex64)
_INF = np.float32(np.inf)
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)


def parts(z) -> tuple[np.ndarray, np.ndarray]:
    """(real, imaginary) as float32 arrays; a real operand has zeros."""
    z = np.asarray(z)
    if z.dtype.kind != "c":
        re = z.astype(_F32)
        return re, np.zeros_like(re)
    z = z.astype(_C64, copy=False)
    return z.real, z.imag


def pair(re, im) -> np.ndarray:
    """The complex64 array of these parts (inf * 1j would make a NaN)."""
    re, im = np.broadcast_arrays(np.asarray(re, _F32), np.asarray(im, _F32))
    out = np.empty(re.shape, _C64)
    out.real, out.imag = re, im
    return out


def real(z, dtype, attrs):
    return np.array(parts(z)[0])


def imag(z, dtype, attrs):
    return np.array(parts(z)[1])


def complex_(re, im, dtype, attrs):
    return pair(re, im)


def multiply(a, b, dtype, attrs):
    ar, ai = parts(a)
    br, bi = parts(b)
    return pair(ar * br - ai * bi, ai * br + ar * bi)


def divide(a, b, dtype, attrs):
    """Smith's algorithm, dividing by the larger of the divisor's parts,
    with the infinite and zero cases of C's Annex G."""
    lr, li = parts(a)
    rr, ri = parts(b)
    ratio1 = rr / ri
    denom1 = ri + ratio1 * rr
    re1, im1 = (lr * ratio1 + li) / denom1, (li * ratio1 - lr) / denom1
    ratio2 = ri / rr
    denom2 = rr + ratio2 * ri
    re2, im2 = (lr + li * ratio2) / denom2, (li - lr * ratio2) / denom2
    rra, ria, lra, lia = np.abs(rr), np.abs(ri), np.abs(lr), np.abs(li)
    smaller = rra < ria
    re, im = np.where(smaller, re1, re2), np.where(smaller, im1, im2)
    # By zero: an infinity of the divisor's real part's sign times each part.
    by_zero = (~np.isnan(lr) | ~np.isnan(li)) & (rra == 0) & (ria == 0)
    signed_inf = np.copysign(_INF, rr)
    # An infinite dividend over a finite divisor.
    finite_divisor = np.isfinite(rr) & np.isfinite(ri)
    infinite_dividend = (lra == _INF) | (lia == _INF)
    lr1 = np.copysign(np.where(lra == _INF, _ONE, _ZERO), lr)
    li1 = np.copysign(np.where(lia == _INF, _ONE, _ZERO), li)
    # A finite dividend over an infinite divisor.
    finite_dividend = np.isfinite(lr) & np.isfinite(li)
    infinite_divisor = (rra == _INF) | (ria == _INF)
    rr1 = np.copysign(np.where(rra == _INF, _ONE, _ZERO), rr)
    ri1 = np.copysign(np.where(ria == _INF, _ONE, _ZERO), ri)
    special_re = np.where(by_zero, signed_inf * lr,
                          np.where(infinite_dividend & finite_divisor, _INF * (lr1 * rr + li1 * ri),
                                   np.where(finite_dividend & infinite_divisor, _ZERO * (lr * rr1 + li * ri1), re)))
    special_im = np.where(by_zero, signed_inf * li,
                          np.where(infinite_dividend & finite_divisor, _INF * (li1 * rr - lr1 * ri),
                                   np.where(finite_dividend & infinite_divisor, _ZERO * (li * rr1 - lr * ri1), im)))
    nan = np.isnan(re) & np.isnan(im)
    return pair(np.where(nan, special_re, re), np.where(nan, special_im, im))


def _abs(re, im):
    """|z|, correctly rounded as C's cabsf; NaN when a part is NaN (an
    infinite one too)."""
    return np.where(np.isnan(re) | np.isnan(im), np.float32(np.nan), np.abs(pair(re, im))).astype(_F32)


def abs_(z, dtype, attrs):
    return _abs(*parts(z))


def sign(z, dtype, attrs):
    re, im = parts(z)
    r = _abs(re, im)
    zero = (re == 0) & (im == 0)
    return pair(np.where(zero, re, re / r), np.where(zero, im, im / r))


def exponential(z, dtype, attrs):
    re, im = parts(z)
    e = np.exp(re)
    return pair(np.where(im == 0, e, e * np.cos(im)), np.where(im == 0, im, e * np.sin(im)))


def _cosm1(x):
    """cos(x) - 1 without cancellation near 0 (Cephes' cosm1 polynomial)."""
    coefficients = (4.7377507964246204691685e-14, -1.1470284843425359765671e-11, 2.0876754287081521758361e-9,
                    -2.7557319214999787979814e-7, 2.4801587301570552304991e-5, -1.3888888888888872993737e-3,
                    4.1666666666666666609054e-2)
    x2 = x * x
    poly = np.float32(coefficients[0])
    for c in coefficients[1:]:
        poly = poly * x2 + np.float32(c)
    small = (x2 * x2) * poly + np.float32(-0.5) * x2
    return np.where(x2 >= np.float32(0.61685), np.cos(x) - _ONE, small).astype(_F32)


def exponential_minus_one(z, dtype, attrs):
    re, im = parts(z)
    expm1 = np.expm1(re)
    cosm1 = _cosm1(im)
    real_part = expm1 * (cosm1 + _ONE) + cosm1
    return pair(real_part, np.where(im == 0, _ZERO, (expm1 + _ONE) * np.sin(im)))


def log(z, dtype, attrs):
    """log|z| as log(max) + log1p((min / max)^2) / 2 (no overflow, and
    accurate where |z| is near 1), and the argument."""
    re, im = parts(z)
    top, bottom = np.maximum(np.abs(re), np.abs(im)), np.minimum(np.abs(re), np.abs(im))
    ratio = bottom / top
    magnitude = np.log(top) + _HALF * np.log1p(ratio * ratio)
    magnitude = np.where(np.isnan(magnitude), np.log(_abs(re, im)), magnitude)
    return pair(magnitude, np.arctan2(im, re))


def log_plus_one(z, dtype, attrs):
    re, im = parts(z)
    re1 = re + _ONE
    abs_re1, abs_im = np.abs(re1), np.abs(im)
    top, bottom = np.maximum(abs_re1, abs_im), np.minimum(abs_re1, abs_im)
    use_real = re1 > abs_im
    ratio = bottom / top
    r = _HALF * np.log1p(ratio * ratio) + np.log1p(np.where(use_real, re, top - _ONE))
    r = np.where(np.isnan(r), np.where(top == 0, -_INF, bottom), r)
    return pair(r, np.arctan2(im, re1))


def sqrt(z, dtype, attrs):
    """Friedland's algorithm (ACM 312): t = sqrt(|re| / 2 + |z / 2|) (no
    overflow), the other part |im| / 2t, the signs from re and im; zero at
    zero, and an infinite imaginary part (with a real part that is no NaN)
    gives infinity."""
    re, im = parts(z)
    t = np.sqrt(_HALF * np.abs(re) + _abs(_HALF * re, _HALF * im))
    other = im / (t + t)
    out_re = np.where(re >= 0, t, np.abs(other))
    out_im = np.where(re >= 0, np.where(im == 0, _ZERO, other), np.where(im >= 0, t, -t))
    infinite = (np.abs(im) == _INF) & ~np.isnan(re)
    out_re, out_im = np.where(infinite, _INF, out_re), np.where(infinite, im, out_im)
    zero = t == 0
    return pair(np.where(zero, _ZERO, out_re), np.where(zero, _ZERO, out_im))


def rsqrt(z, dtype, attrs):
    re, im = parts(z)
    top, bottom = np.maximum(np.abs(re), np.abs(im)), np.minimum(np.abs(re), np.abs(im))
    ratio = bottom / top
    scaled = _ONE / np.sqrt(ratio * ratio + _ONE)
    result = (_ONE / np.sqrt(top)) * np.sqrt(scaled)
    root = np.where(np.isnan(result), _ONE / np.sqrt(bottom), result)
    angle = np.arctan2(im, re) * np.float32(-0.5)
    out_re, out_im = root * np.cos(angle), root * np.sin(angle)
    to_zero = ((np.abs(im) == _INF) & np.isnan(re)) | (np.abs(re) == _INF)
    out_re = np.where(to_zero, np.copysign(_ZERO, re), out_re)
    out_im = np.where(to_zero, -np.copysign(_ZERO, im), out_im)
    zero = (re == 0) & (im == 0)
    return pair(np.where(zero, _INF, out_re), np.where(zero, np.float32(np.nan), out_im))


def power(a, b, dtype, attrs):
    """|a|^c e^(-d arg a) (cos q + i sin q), q = c arg a + d ln|a|, with
    Kahan's cases 0^w, w^0, 1^w and inf^c."""
    ar, ai = parts(a)
    c, d = parts(b)
    r = _abs(ar, ai)
    angle = np.arctan2(ai, ar)
    coefficient = np.power(r, c) * np.exp(-d * angle)
    q = c * angle + d * np.log(r)
    out_re, out_im = coefficient * np.cos(q), coefficient * np.sin(q)
    c_zero, d_zero = c == 0, d == 0
    at_zero = (r == 0) & d_zero & (c >= 0)
    out_re = np.where(at_zero, np.where(c_zero, _ONE, _ZERO), out_re)
    out_im = np.where(at_zero, _ZERO, out_im)
    one = (c_zero & d_zero) | ((ar == _ONE) & (ai == 0))
    out_re, out_im = np.where(one, _ONE, out_re), np.where(one, _ZERO, out_im)
    infinite = (ar == _INF) & (ai == 0) & d_zero
    out_re = np.where(infinite & (c > 0), _INF, np.where(infinite & (c < 0), _ZERO, out_re))
    out_im = np.where(infinite & (c != 0), _ZERO, out_im)
    return pair(out_re, out_im)


def _tanh_parts(re, im):
    """tanh(re + i im) as (real, imaginary)."""
    expm1_pos, expm1_neg = np.expm1(re + re), np.expm1(-(re + re))
    cos, sin = np.cos(im), np.sin(im)
    four = np.float32(4.0)
    real_num = expm1_pos - expm1_neg
    imag_num = four * (cos * sin)
    sum_minus_two = expm1_pos + expm1_neg
    denom = sum_minus_two + (cos * cos) * four
    out_re = np.where(sum_minus_two == _INF, np.copysign(_ONE, re), real_num / denom)
    out_im = imag_num / denom
    abs_re_inf = np.abs(re) == _INF
    imag_nan = np.isnan(imag_num)
    out_re = np.where(imag_nan & ~abs_re_inf, np.float32(np.nan), out_re)
    out_im = np.where((im == 0) | (abs_re_inf & imag_nan), _ZERO, out_im)
    return out_re, out_im


def tanh(z, dtype, attrs):
    return pair(*_tanh_parts(*parts(z)))


def tan(z, dtype, attrs):
    # tan(x + iy) = -i tanh(-y + ix)
    re, im = parts(z)
    out_re, out_im = _tanh_parts(-im, re)
    return pair(out_im, -out_re)


def _trig(z):
    re, im = parts(z)
    e = np.exp(im)
    return _HALF * e, _HALF / e, np.sin(re), np.cos(re)


def sine(z, dtype, attrs):
    scaled, reciprocal, sin, cos = _trig(z)
    return pair((scaled + reciprocal) * sin, (scaled - reciprocal) * cos)


def cosine(z, dtype, attrs):
    scaled, reciprocal, sin, cos = _trig(z)
    return pair((reciprocal + scaled) * cos, (reciprocal - scaled) * sin)


def logistic(z, dtype, attrs):
    # 1 / (1 + exp(-z)), as XLA's LogisticExpander writes it.
    one = pair(_ONE, _ZERO)
    return divide(one, one + exponential(-np.asarray(z, _C64), dtype, attrs), dtype, attrs)


def compare(a, b, dtype, attrs):
    direction = attrs["comparison_direction"]
    if direction not in ("EQ", "NE"):
        raise ValueError(f"complex numbers have no order: compare {direction}")
    ar, ai = parts(a)
    br, bi = parts(b)
    return (ar == br) & (ai == bi) if direction == "EQ" else (ar != br) | (ai != bi)


FUNCTIONS = {
    "real": real, "imag": imag, "complex": complex_, "multiply": multiply, "divide": divide, "abs": abs_,
    "sign": sign, "exponential": exponential, "exponential_minus_one": exponential_minus_one, "log": log,
    "log_plus_one": log_plus_one, "sqrt": sqrt, "rsqrt": rsqrt, "power": power, "tanh": tanh, "tan": tan,
    "sine": sine, "cosine": cosine, "logistic": logistic, "compare": compare,
}
# Ops that act on each part on its own, as numpy's complex ufuncs do.
BY_PARTS = {"add": np.add, "subtract": np.subtract, "negate": np.negative}

# The float32 ops each complex op takes per element (what the tile's float2
# vector unit and its function library run), for the cost model: two lanes
# a cycle, so a component op costs half its cycles per vector per element.
COMPONENTS: dict[str, dict[str, int]] = {
    "add": {"add": 2}, "subtract": {"subtract": 2}, "negate": {"negate": 2},
    "real": {}, "imag": {}, "complex": {},
    "multiply": {"multiply": 4, "add": 2},
    "divide": {"divide": 6, "multiply": 6, "add": 6, "abs": 4, "compare": 8, "select": 6},
    "abs": {"multiply": 2, "add": 1, "sqrt": 1, "divide": 1, "maximum": 1, "minimum": 1},
    "sign": {"multiply": 2, "add": 1, "sqrt": 1, "divide": 3, "compare": 2, "select": 2},
    "exponential": {"exponential": 1, "cosine": 1, "sine": 1, "multiply": 2},
    "exponential_minus_one": {"exponential_minus_one": 1, "cosine": 1, "sine": 1, "multiply": 12, "add": 10},
    "log": {"log": 1, "atan2": 1, "multiply": 2, "add": 1, "sqrt": 1, "divide": 1},
    "log_plus_one": {"log_plus_one": 2, "atan2": 1, "multiply": 3, "add": 3, "divide": 1},
    "sqrt": {"sqrt": 1, "power": 1, "atan2": 1, "cosine": 1, "sine": 1, "multiply": 4, "divide": 1,
             "select": 6},
    "rsqrt": {"sqrt": 3, "atan2": 1, "cosine": 1, "sine": 1, "multiply": 4, "divide": 3, "select": 4},
    "power": {"power": 1, "exponential": 1, "log": 1, "atan2": 1, "cosine": 1, "sine": 1, "sqrt": 1,
              "multiply": 8, "add": 2, "select": 8},
    "tanh": {"exponential_minus_one": 2, "cosine": 1, "sine": 1, "multiply": 5, "add": 3, "divide": 2,
             "select": 3},
    "tan": {"exponential_minus_one": 2, "cosine": 1, "sine": 1, "multiply": 5, "add": 3, "divide": 2,
            "select": 3},
    "sine": {"exponential": 1, "sine": 1, "cosine": 1, "multiply": 4, "add": 2, "divide": 1},
    "cosine": {"exponential": 1, "sine": 1, "cosine": 1, "multiply": 4, "add": 2, "divide": 1},
    "logistic": {"exponential": 1, "cosine": 1, "sine": 1, "divide": 6, "multiply": 8, "add": 8, "select": 6},
    "compare": {"compare": 2, "and": 1},
    "select": {"select": 2},
    "convert": {},
}
