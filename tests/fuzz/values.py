"""Input values for fuzzed programs: every IPU dtype, with the special
values where backends part ways (NaN, +-inf, -0.0, subnormals, the largest
finite values, integer limits, rounding ties), and their printing as
Python source for reproducers."""
from __future__ import annotations

import numpy as np

DTYPES = [np.dtype(t) for t in (np.float32, np.float16, np.int32, np.uint32, np.int16, np.uint16,
                                np.int8, np.uint8, np.bool_)]
FLOATS = [d for d in DTYPES if d.kind == "f"]
INTS = [d for d in DTYPES if d.kind in "iu"]


def float_specials(dtype: np.dtype) -> np.ndarray:
    fi = np.finfo(dtype)
    return np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, fi.tiny, -fi.tiny, fi.smallest_subnormal,
                     -fi.smallest_subnormal, fi.tiny / 4, fi.max, -fi.max, 1.0, -1.0, 0.5, -0.5, 2.5,
                     -3.5, fi.eps, 1 + fi.eps, 88.5, -104.0, 11.5], dtype=np.float64).astype(dtype)


def int_specials(dtype: np.dtype) -> np.ndarray:
    ii = np.iinfo(dtype)
    vals = [0, 1, 2, ii.max, ii.max - 1, ii.min, 7, 31, 32, 255]
    if ii.min < 0:
        vals += [-1, -2, ii.min + 1, -7, -32]
    return np.array([v for v in vals if ii.min <= v <= ii.max], dtype=np.int64).astype(dtype)


def random_values(rng: np.random.Generator, shape, dtype, special: float = 0.15) -> np.ndarray:
    """Values of `dtype`; about a `special` share of the elements special."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return (rng.random(n) < 0.5).reshape(shape)
    if dtype.kind == "f":
        style = rng.integers(4)
        if style == 0:       # small integers: ties in comparisons, exact sums
            v = rng.integers(-8, 9, n).astype(np.float64)
        elif style == 1:
            v = rng.standard_normal(n)
        elif style == 2:
            v = rng.uniform(-4, 4, n)
        else:                # many magnitudes
            v = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 7, n)
        with np.errstate(over="ignore"):     # magnitudes beyond f16's range become inf
            v = v.astype(dtype)
        specials = float_specials(dtype)
    else:
        ii = np.iinfo(dtype)
        if rng.random() < 0.5:
            v = rng.integers(max(ii.min, -20), min(ii.max, 20), n, endpoint=True)
        else:
            v = rng.integers(ii.min, ii.max, n, endpoint=True, dtype=np.int64)
        v = v.astype(dtype)
        specials = int_specials(dtype)
    if special > 0 and n:
        mask = rng.random(n) < special * rng.random() * 2
        v[mask] = rng.choice(specials, int(mask.sum()))
    return v.reshape(shape)


def scalar_source(value, dtype) -> str:
    """A Python expression for one value of dtype: np.float32(-0.0)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return repr(bool(value))
    if dtype.kind == "f":
        v = float(value)
        text = "nan" if np.isnan(v) else ("inf" if v == np.inf else "-inf" if v == -np.inf else repr(v))
        return f"np.{dtype.name}({text})"
    return f"np.{dtype.name}({int(value)})"


def _item_source(x, dtype) -> str:
    if dtype == np.bool_:
        return repr(bool(x))
    if dtype.kind == "f":
        return "nan" if np.isnan(x) else "inf" if x == np.inf else "-inf" if x == -np.inf else repr(float(x))
    return str(int(x))


# Defined by reproducers that print arrays with arr().
ARR_SOURCE = """def arr(shape, dtype, fill, changes=None):
    a = np.full(shape, fill, dtype)
    for i, v in (changes or {}).items():
        a.flat[i] = v
    return a
"""


# Large inputs repeat a block of this many values (a prime: no power-of-two
# chunk of a large array repeats another).
PERIOD = 4099


def array_source(a: np.ndarray) -> str:
    """A Python expression giving array `a` (its dtype, shape and values;
    NaN payloads are not kept). Arrays of more than 8 elements print as
    arr(shape, dtype, the most common value, {flat index: other value});
    large ones that repeat a block of PERIOD values, as that block resized."""
    a = np.asarray(a)
    flat = a.ravel()
    if a.size > 2 * PERIOD:
        block = flat[:PERIOD]
        same = np.resize(block, a.size)
        if np.array_equal(same.view(np.uint8), flat.view(np.uint8)):
            return f"np.resize({array_source(block)}, {tuple(a.shape)})"
    items = [_item_source(x, a.dtype) for x in flat]
    if a.size <= 8:
        return f"np.array([{', '.join(items)}], np.{a.dtype.name}).reshape({tuple(a.shape)})"
    values, counts = np.unique(np.array(items), return_counts=True)
    fill = values[np.argmax(counts)]
    changes = ", ".join(f"{i}: {t}" for i, t in enumerate(items) if t != fill)
    return f"arr({tuple(a.shape)}, np.{a.dtype.name}, {fill}" + (f", {{{changes}}})" if changes else ")")
