"""Random JAX programs over every op family the ipu compiler lowers.

A Program is Python source: a function `f` of its inputs, one line per op
(`v3 = jnp.cumsum(v1, axis=0)`), and the inputs' values. Being source, it
prints as a reproducer and shrinks by editing lines (minimise.py).

The generator proposes an op on the values made so far, checks it with
jax.eval_shape (an op JAX rejects is dropped), and records for each value
what the comparison may expect of it (compare.py):

- exact: both backends must give the same bits (up to NaN payloads, and
  the sign of zero where `zero_sign` is off). Integer and bool values are
  always exact. A float value is exact when every op on its path is exact
  by nature (neg, abs, floor, max, select, casts, moves, compares...) or
  is one correctly rounded op (+, -, *) on `pristine` operands (inputs,
  or exact-by-nature results of them): a second rounding op could be
  contracted by XLA:CPU into a fused multiply-add, or computed in f32
  inside a float16 fusion.
- Ops that are discontinuous (floor, compare, cast to an integer, sort
  order, argmax, rem, bitcast...) or that amplify an error without bound
  near a point (division's denominator, pow, atan2, rsqrt, tan) are only
  applied to exact values, so a rounding difference upstream can never
  become a large one downstream.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_ipu.model.fast import blas, lanes, xla_chains
from jax_ipu.model.fast import chains as model_elementwise
from jax_ipu.model.fast import reduce as model_reduce
from jax_ipu.pjrt.executable import QUICK_ELEMENTS
from values import (
    ARR_SOURCE,
    DTYPES,
    FLOATS,
    PERIOD,
    array_source,
    float_specials,
    int_specials,
    random_values,
    scalar_source,
)


def _ftz(x):
    """x with float32 subnormals made zeros of their sign (compare.py)."""
    return jnp.where(jnp.abs(x) < np.finfo(np.float32).tiny, x * np.float32(0), x)


def _underflow32(x):
    """x (a float32 value computed in float64) with what float32 cannot hold
    even as a subnormal made a zero of its sign (compare.py's float64 model
    of IEEE float32 arithmetic)."""
    return jnp.where(jnp.abs(x) < np.float64(np.finfo(np.float32).smallest_subnormal) / 2, x * 0, x)


def _nan_kept(x, result, nan_found):
    """result, NaN where nan_found: what a max or min reduction gives by
    XLA's semantics (compare.py: XLA:CPU's kernels may drop a NaN)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return result
    return jnp.where(nan_found, jnp.array(jnp.nan, result.dtype), result)


def _nan_max(x, axis=None):
    return _nan_kept(x, jnp.max(x, axis=axis), jnp.any(jnp.isnan(x), axis=axis))


def _nan_min(x, axis=None):
    return _nan_kept(x, jnp.min(x, axis=axis), jnp.any(jnp.isnan(x), axis=axis))


def _nan_reduce(x, init, op, dims):
    result = lax.reduce(x, init, op, dims)
    if op not in (lax.max, lax.min):
        return result
    return _nan_kept(x, result, jnp.any(jnp.isnan(x), axis=dims))


def _nan_reduce_window(x, init, op, *args, **kwargs):
    result = lax.reduce_window(x, init, op, *args, **kwargs)
    if op not in (lax.max, lax.min) or not jnp.issubdtype(x.dtype, jnp.floating):
        return result
    found = lax.reduce_window(jnp.isnan(x).astype(np.float32), np.float32(0), lax.add, *args, **kwargs) > 0
    return _nan_kept(x, result, found)


NAMESPACE = {"jax": jax, "jnp": jnp, "lax": lax, "np": np, "inf": np.inf, "nan": np.nan, "_ftz": _ftz,
             "_underflow32": _underflow32,
             "_nan_max": _nan_max, "_nan_min": _nan_min, "_nan_reduce": _nan_reduce,
             "_nan_reduce_window": _nan_reduce_window}


@dataclasses.dataclass
class Var:
    shape: tuple
    dtype: np.dtype
    exact: bool = True
    pristine: bool = True
    zero_sign: bool = True
    # A sum's (dot's, reduction's...) value: its error is relative to the
    # terms' scale, not to itself (a sum that cancels), so a nonlinear op of
    # it (sigmoid, exp) can differ by anything: such ops take no such value.
    scaled: bool = False

    @property
    def kind(self) -> str:
        return "b" if self.dtype == np.bool_ else self.dtype.kind

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclasses.dataclass
class Program:
    inputs: dict            # name -> np.ndarray (for pmap: leading axis of 2, one row per device)
    lines: list             # (name, expression, family)
    outputs: list           # names
    vars: dict              # name -> Var (per-device shapes for pmap)
    kind: str = "jit"       # "jit", or "pmap" over 2 devices (the CPU reference: vmap)
    seed: int | None = None

    def source(self) -> str:
        body = "".join(f"    {name} = {expr}\n" for name, expr, _ in self.lines)
        return f"def f({', '.join(self.inputs)}):\n{body}    return ({''.join(o + ', ' for o in self.outputs)})\n"

    def function(self):
        namespace = dict(NAMESPACE)
        exec(self.source(), namespace)
        return namespace["f"]

    def families(self) -> list[str]:
        return [family for *_, family in self.lines]

    def reproducer(self) -> str:
        args = ",\n        ".join(array_source(v) for v in self.inputs.values())
        if self.kind == "pmap":
            run_ipu = "jax.pmap(f, axis_name='i', devices=jax.devices('ipu')[:2])(*args)"
            run_cpu = "jax.jit(jax.vmap(f, axis_name='i'))(*jax.device_put(args, jax.devices('cpu')[0]))"
        else:
            run_ipu = "jax.jit(f)(*jax.device_put(args, jax.devices('ipu')[0]))"
            run_cpu = "jax.jit(f)(*jax.device_put(args, jax.devices('cpu')[0]))"
        return ("import jax, jax.numpy as jnp, numpy as np\nfrom jax import lax\ninf, nan = np.inf, np.nan\n\n"
                + ARR_SOURCE + "\n\n"
                + self.source() + f"\nargs = [{args}]\n"
                + f"print('ipu', {run_ipu})\nprint('cpu', {run_cpu})\n")


# Families whose float results are sums of many terms (Var.scaled).
_SUMMING_FAMILIES = {"reduce", "dot", "conv", "window", "collective", "control"}


class Rejected(Exception):
    pass


class Builder:
    def __init__(self, rng: np.random.Generator, kind: str = "jit"):
        self.rng, self.kind = rng, kind
        self.inputs: dict = {}
        self.vars: dict = {}
        self.lines: list = []
        # Largest result; threshold-sized programs (generate_sized) go higher.
        self.max_elements = 20000
        # Inputs of more elements repeat a random block of PERIOD values
        # (reproducers stay short; no power-of-two chunk repeats another).
        self.periodic_from = None
        # generate_sized's reductions run over this axis (from the end).
        self.reduce_last_axis = False

    # ---- values ----
    def _name(self) -> str:
        return f"v{len(self.vars)}"

    def new_input(self, shape, dtype, values=None) -> str:
        name = self._name()
        dtype = np.dtype(dtype)
        lead = (2,) if self.kind == "pmap" else ()
        if values is None:
            size = int(np.prod(lead + tuple(shape), dtype=np.int64))
            if self.periodic_from is not None and size > self.periodic_from:
                values = np.resize(random_values(self.rng, (PERIOD,), dtype, special=self.special), size)
            else:
                values = random_values(self.rng, lead + tuple(shape), dtype, special=self.special)
        self.inputs[name] = np.asarray(values, dtype).reshape(lead + tuple(shape))
        self.vars[name] = Var(tuple(shape), dtype)
        return name

    def index_input(self, shape, low, high) -> str:
        """An int32 input of indices in [low, high]."""
        lead = (2,) if self.kind == "pmap" else ()
        return self.new_input(shape, np.int32, self.rng.integers(low, high, lead + tuple(shape), endpoint=True))

    def pick(self, pred=lambda v: True):
        names = [n for n, v in self.vars.items() if pred(v)]
        if not names:
            return None
        # Prefer recent values, so programs chain.
        weights = np.arange(1, len(names) + 1, dtype=np.float64) ** 2
        return names[self.rng.choice(len(names), p=weights / weights.sum())]

    def var_or_input(self, pred, shape_dtype):
        name = self.pick(pred) if self.rng.random() < 0.8 else None
        return name if name is not None else self.new_input(*shape_dtype())

    def like(self, name, same_exactness=False) -> str:
        """Another value of the shape and dtype of `name` (or a new input)."""
        v = self.vars[name]
        cands = [n for n, w in self.vars.items() if n != name and w.shape == v.shape and w.dtype == v.dtype
                 and (not same_exactness or w.exact)]
        if cands and self.rng.random() < 0.5:
            return cands[self.rng.integers(len(cands))]
        return self.new_input(v.shape, v.dtype)

    def literal(self, dtype, special_ok=True) -> str:
        dtype = np.dtype(dtype)
        if dtype == np.bool_:
            return repr(bool(self.rng.integers(2)))
        if dtype.kind == "f":
            pool = float_specials(dtype) if special_ok and self.rng.random() < 0.3 else \
                np.array([0.5, 2.0, -1.5, 3.0, 0.25, -7.0, 1.0, 10.0], dtype)
        else:
            pool = int_specials(dtype) if special_ok and self.rng.random() < 0.3 else \
                np.array([v for v in (1, 2, 3, 5, 7, -1, -3) if v >= 0 or dtype.kind == "i"], dtype)
        return scalar_source(self.rng.choice(pool), dtype)

    # ---- ops ----
    def add(self, expr: str, family: str, exact=True, pristine=False, zero_sign=True) -> str:
        names = list(self.vars)
        structs = [jax.ShapeDtypeStruct(((2,) if self.kind == "pmap" else ()) + v.shape, v.dtype)
                   for v in self.vars.values()]

        def fn(*args):
            return eval(expr, NAMESPACE, dict(zip(names, args, strict=True)))
        try:
            out = jax.eval_shape(jax.vmap(fn, axis_name="i") if self.kind == "pmap" else fn, *structs)
        except Exception as e:     # an op JAX rejects (shapes, dtypes): propose another
            raise Rejected(f"{expr}: {e}") from None
        if not isinstance(out, jax.ShapeDtypeStruct):
            raise Rejected(f"{expr}: not one array")
        shape = tuple(out.shape[1:] if self.kind == "pmap" else out.shape)
        if int(np.prod(shape, dtype=np.int64)) > self.max_elements:
            raise Rejected(f"{expr}: too large")
        dtype = np.dtype(out.dtype)
        if dtype not in DTYPES:
            raise Rejected(f"{expr}: {dtype}")
        name = self._name()
        if dtype.kind != "f":
            exact, pristine, zero_sign = True, True, True
        scaled = dtype.kind == "f" and not exact and (
            family in _SUMMING_FAMILIES or any(self.vars[n].scaled for n in re.findall(r"\bv\d+\b", expr)
                                               if n in self.vars))
        self.vars[name] = Var(shape, dtype, exact, pristine and exact, zero_sign and exact, scaled)
        self.lines.append((name, expr, family))
        return name


def random_shape(rng, min_rank=0, max_rank=3) -> tuple:
    if rng.random() < 0.03:
        return (int(rng.integers(300, 3000)),)
    rank = int(rng.choice([0, 1, 2, 3], p=[0.1, 0.35, 0.35, 0.2]))
    rank = min(max(rank, min_rank), max_rank)
    dims = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]
    shape = tuple(int(rng.choice(dims)) for _ in range(rank))
    if shape and rng.random() < 0.03:
        shape = shape[:-1] + (0,)
    while int(np.prod(shape, dtype=np.int64)) > 512:
        shape = shape[1:]
    return shape


# ---------------------------------------------------------------- element-wise

# name: (template, dtype kinds, class). Classes: "nature" exact by nature;
# "round" one correctly rounded op (exact on pristine operands); "approx"
# inexact (transcendental, or XLA:CPU's division); "disc" discontinuous
# (operands must be exact; the result is); "discz" as disc, and the sign of
# the operands' zeros must be known (signbit, nextafter); "amp" amplifying
# an error near a point (operands exact with known zero signs; the result
# is inexact: pow, atan2, rsqrt, tan); "periodic" sin and cos, whose
# argument's last-ulp error grows with its size (cos(exp(14)) moves by 0.3
# for an ulp of exp): operands exact, the result inexact.
UNARY = {
    "neg": ("-{a}", "fiu", "nature"), "abs": ("jnp.abs({a})", "fi", "nature"), "not": ("~{a}", "iub", "nature"),
    "floor": ("jnp.floor({a})", "f", "disc"), "ceil": ("jnp.ceil({a})", "f", "disc"),
    "round": ("jnp.round({a})", "f", "disc"), "trunc": ("jnp.trunc({a})", "f", "disc"),
    "round_afz": ("lax.round({a}, lax.RoundingMethod.AWAY_FROM_ZERO)", "f", "disc"),
    "sign": ("jnp.sign({a})", "fi", "disc"), "is_finite": ("jnp.isfinite({a})", "f", "disc"),
    "signbit": ("jnp.signbit({a})", "f", "discz"),
    "sqrt": ("jnp.sqrt({a})", "f", "approx"), "rsqrt": ("lax.rsqrt({a})", "f", "amp"),
    "cbrt": ("jnp.cbrt({a})", "f", "approx"), "exp": ("jnp.exp({a})", "f", "approx"),
    "exp2": ("jnp.exp2({a})", "f", "approx"), "expm1": ("jnp.expm1({a})", "f", "approx"),
    "log": ("jnp.log({a})", "f", "approx"), "log1p": ("jnp.log1p({a})", "f", "approx"),
    "tanh": ("jnp.tanh({a})", "f", "approx"), "sin": ("jnp.sin({a})", "f", "periodic"),
    "cos": ("jnp.cos({a})", "f", "periodic"), "tan": ("jnp.tan({a})", "f", "amp"),
    "logistic": ("jax.nn.sigmoid({a})", "f", "approx"), "erf": ("lax.erf({a})", "f", "approx"),
    "square": ("{a} * {a}", "fiu", "round"),
    "popcnt": ("lax.population_count({a})", "iu", "nature"), "clz": ("lax.clz({a})", "iu", "nature"),
    "reduce_precision": ("lax.reduce_precision({a}, 5, 10)", "f", "disc"),
    "integer_pow": ("lax.integer_pow({a}, {k})", "fiu", "approx"),
}
BINARY = {
    "add": ("{a} + {b}", "fiu", "round"), "sub": ("{a} - {b}", "fiu", "round"), "mul": ("{a} * {b}", "fiu", "round"),
    "div": ("lax.div({a}, {b})", "fiu", "div"), "rem": ("lax.rem({a}, {b})", "fiu", "disc"),
    "pow": ("lax.pow({a}, {b})", "f", "amp"), "atan2": ("jnp.arctan2({a}, {b})", "f", "amp"),
    "max": ("jnp.maximum({a}, {b})", "fiub", "nature"), "min": ("jnp.minimum({a}, {b})", "fiub", "nature"),
    "and": ("{a} & {b}", "iub", "nature"), "or": ("{a} | {b}", "iub", "nature"), "xor": ("{a} ^ {b}", "iub", "nature"),
    "shl": ("lax.shift_left({a}, {b})", "iu", "nature"),
    "shrl": ("lax.shift_right_logical({a}, {b})", "iu", "nature"),
    "shra": ("lax.shift_right_arithmetic({a}, {b})", "iu", "nature"),
    "nextafter": ("jnp.nextafter({a}, {b})", "f", "discz"),
    "lt": ("{a} < {b}", "fiub", "disc"), "le": ("{a} <= {b}", "fiub", "disc"), "gt": ("{a} > {b}", "fiub", "disc"),
    "ge": ("{a} >= {b}", "fiub", "disc"), "eq": ("{a} == {b}", "fiub", "disc"), "ne": ("{a} != {b}", "fiub", "disc"),
}
MAX_INEXACT_DEPTH = 3


def _result_flags(cls: str, operands: list[Var]) -> dict:
    exact = all(v.exact for v in operands)
    pristine = all(v.pristine for v in operands)
    zero_sign = all(v.zero_sign for v in operands)
    if cls == "nature":
        return dict(exact=exact, pristine=pristine, zero_sign=zero_sign)
    if cls == "round":
        return dict(exact=pristine, pristine=False, zero_sign=zero_sign)
    if cls in ("disc", "discz"):
        return dict(exact=True, pristine=False, zero_sign=zero_sign)
    return dict(exact=False, pristine=False, zero_sign=False)


def _allowed(cls: str, v: Var) -> bool:
    if v.kind != "f":
        return True
    if cls in ("approx", "periodic") and v.scaled:
        return False
    if cls in ("disc", "periodic"):
        return v.exact
    if cls in ("amp", "discz"):
        return v.exact and v.zero_sign
    return True


def gen_unary(b: Builder):
    name = b.pick(lambda v: v.size > 0 or True)
    v = b.vars[name]
    ops = [k for k, (t, kinds, cls) in UNARY.items() if v.kind in kinds and _allowed(cls, v)]
    op = ops[b.rng.integers(len(ops))]
    template, _, cls = UNARY[op]
    expr = template.format(a=name, k=int(b.rng.integers(0, 5)))
    if op in ("integer_pow", "square") and v.kind == "f":
        cls = "approx" if op == "integer_pow" else cls
    return b.add(expr, "elementwise", **_result_flags(cls, [v]))


def gen_binary(b: Builder):
    name = b.pick()
    v = b.vars[name]
    ops = [k for k, (t, kinds, cls) in BINARY.items() if v.kind in kinds and _allowed(cls, v)]
    op = ops[b.rng.integers(len(ops))]
    template, _, cls = BINARY[op]
    if b.rng.random() < 0.3:
        other = b.literal(v.dtype)
        ov = Var((), v.dtype)
    else:
        other = b.like(name, same_exactness=cls in ("disc", "discz", "amp", "div"))
        ov = b.vars[other]
        if not _allowed(cls, ov) or (cls == "div" and not (ov.exact and ov.zero_sign)):
            other = b.new_input(v.shape, v.dtype)
            ov = b.vars[other]
    a_name, b_name = (name, other) if b.rng.random() < 0.8 else (other, name)
    if cls == "div":
        cls = "nature" if v.kind != "f" else "approx"
    if v.kind != "f" and op in ("rem",):
        cls = "nature"
    flags = _result_flags(cls, [v, ov])
    if op in ("max", "min"):
        flags["zero_sign"] = False
    if op == "nextafter" and v.dtype == np.float32:
        # Of two f32 operands that are zeros or subnormals, XLA:CPU (which
        # reads subnormals as zeros) returns the second: a zero's sign, or a
        # subnormal's, is the flush's.
        flags["zero_sign"] = False
    if op in ("lt", "le", "gt", "ge", "eq", "ne"):
        flags["exact"] = True
    return b.add(template.format(a=a_name, b=b_name), "elementwise", **flags)


def gen_select(b: Builder):
    name = b.pick()
    v = b.vars[name]
    pred = b.pick(lambda w: w.dtype == np.bool_ and w.shape == v.shape)
    if pred is None:
        src = b.pick(lambda w: w.shape == v.shape and w.exact)
        if src is None:
            src = b.new_input(v.shape, np.float32)
        pred = b.add(f"{src} > {scalar_source(0, b.vars[src].dtype)}", "elementwise")
    other = b.like(name)
    ov = b.vars[other]
    if b.rng.random() < 0.25 and v.kind in "fiu":
        lo, hi = sorted([b.rng.integers(-3, 4), b.rng.integers(-3, 4)]) if v.kind != "u" else (1, 5)
        # A max then a min: of zeros of both signs, either may come out (as for max and min).
        return b.add(f"lax.clamp({scalar_source(lo, v.dtype)}, {name}, {scalar_source(hi, v.dtype)})",
                     "elementwise", **dict(_result_flags("nature", [v]), zero_sign=False))
    return b.add(f"jnp.where({pred}, {name}, {other})", "elementwise", **_result_flags("nature", [v, ov]))


# ---------------------------------------------------------------- casts, bitcasts

def gen_cast(b: Builder):
    name = b.pick()
    v = b.vars[name]
    to = DTYPES[b.rng.integers(len(DTYPES))]
    if v.kind == "f" and to.kind != "f" and not v.exact:
        return None             # float -> int/bool is discontinuous
    if v.kind == "f" and to.kind == "f":
        flags = dict(exact=v.exact and (v.pristine or to.itemsize >= v.dtype.itemsize), pristine=v.pristine,
                     zero_sign=v.zero_sign)
        if to.itemsize < v.dtype.itemsize:    # a rounding: a second rounding after it may fuse
            flags["pristine"] = False
    elif to.kind == "f":   # int/bool -> float: one correctly rounded conversion
        flags = dict(exact=True, pristine=False, zero_sign=True)
    else:
        flags = {}
    form = b.rng.integers(2)
    expr = f"{name}.astype(np.{to.name})" if form else f"lax.convert_element_type({name}, np.{to.name})"
    return b.add(expr, "cast", **flags)


def gen_bitcast(b: Builder):
    name = b.pick(lambda v: v.dtype != np.bool_ and (v.kind != "f" or (v.exact and v.zero_sign)))
    if name is None:
        name = b.new_input(random_shape(b.rng), DTYPES[b.rng.integers(8)])
    v = b.vars[name]
    same = [d for d in DTYPES if d != np.bool_ and d.itemsize == v.dtype.itemsize and d != v.dtype]
    if b.rng.random() < 0.7 and same:
        to = same[b.rng.integers(len(same))]
        return b.add(f"lax.bitcast_convert_type({name}, np.{to.name})", "bitcast",
                     exact=True, pristine=v.pristine, zero_sign=True)
    smaller = [d for d in DTYPES if d != np.bool_ and d.itemsize < v.dtype.itemsize]
    larger = [d for d in DTYPES if d != np.bool_ and d.itemsize > v.dtype.itemsize]
    if smaller and b.rng.random() < 0.5:
        to = smaller[b.rng.integers(len(smaller))]
    elif larger and v.shape and v.shape[-1] == larger[0].itemsize // v.dtype.itemsize:
        to = larger[b.rng.integers(len(larger))]
    else:
        return None
    return b.add(f"lax.bitcast_convert_type({name}, np.{to.name})", "bitcast", exact=True, pristine=True)


# ---------------------------------------------------------------- moves

def gen_structural(b: Builder):
    name = b.pick()
    v = b.vars[name]
    r, rng = len(v.shape), b.rng
    flags = _result_flags("nature", [v])
    choice = rng.integers(9)
    if choice == 0 and v.size:
        dims = list(v.shape)
        rng.shuffle(dims)
        return b.add(f"{name}.reshape({tuple(int(d) for d in dims)})", "structural", **flags)
    if choice == 1 and r >= 2:
        return b.add(f"jnp.transpose({name}, {tuple(int(i) for i in rng.permutation(r))})", "structural", **flags)
    if choice == 2:
        return b.add(f"jnp.broadcast_to({name}, {(int(rng.integers(1, 4)),) + v.shape})", "structural", **flags)
    if choice == 3 and r >= 1:
        axis = int(rng.integers(r))
        other = b.like(name)
        flags = _result_flags("nature", [v, b.vars[other]])
        return b.add(f"jnp.concatenate([{name}, {other}], axis={axis})", "structural", **flags)
    if choice == 4 and r >= 1:
        cfg = [(int(rng.integers(-1, 3)), int(rng.integers(-1, 3)), int(rng.integers(0, 2))) for _ in v.shape]
        value = b.literal(v.dtype)
        return b.add(f"lax.pad({name}, {value}, {cfg})", "structural", **flags)
    if choice == 5 and r >= 1:
        return b.add(f"jnp.flip({name}, axis={int(rng.integers(r))})", "structural", **flags)
    if choice == 6 and r >= 1:
        starts = [int(rng.integers(0, max(d, 1))) for d in v.shape]
        limits = [int(rng.integers(s, d + 1)) for s, d in zip(starts, v.shape, strict=True)]
        strides = [int(rng.integers(1, 3)) for _ in v.shape]
        return b.add(f"lax.slice({name}, {starts}, {limits}, {strides})", "structural", **flags)
    if choice == 7 and r >= 1:
        dim = int(rng.integers(r))
        dt = v.dtype.name if v.dtype != np.bool_ else "int32"
        return b.add(f"{name} + lax.broadcasted_iota(np.{dt}, {v.shape}, {dim})" if v.dtype != np.bool_ else
                     f"lax.broadcasted_iota(np.int32, {v.shape}, {dim})", "structural",
                     exact=v.exact and v.pristine, pristine=False, zero_sign=v.zero_sign)
    return b.add(f"jnp.expand_dims({name}, {int(rng.integers(r + 1))})", "structural", **flags)


# ---------------------------------------------------------------- reductions

def _axes(rng, rank):
    if rank == 0 or rng.random() < 0.2:
        return None
    k = int(rng.integers(1, rank + 1))
    return tuple(int(a) for a in sorted(rng.choice(rank, k, replace=False)))


def gen_reduce(b: Builder):
    name = b.pick()
    v = b.vars[name]
    axes = _axes(b.rng, len(v.shape))
    if b.reduce_last_axis and v.shape and b.rng.random() < 0.8:
        axes = (len(v.shape) - 1,)
    op = ["sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "lax_add", "lax_max", "lax_xor",
          "lax_mul"][b.rng.integers(12)]
    inexact = dict(exact=False, pristine=False, zero_sign=False)
    if op in ("sum", "prod"):
        return b.add(f"jnp.{op}({name}, axis={axes})", "reduce", **inexact)
    if op in ("max", "min"):
        if v.size == 0:
            return None
        return b.add(f"jnp.{op}({name}, axis={axes})", "reduce", exact=v.exact, zero_sign=False)
    if op in ("argmax", "argmin"):
        if not v.exact or not v.shape or v.size == 0:
            return None
        return b.add(f"jnp.{op}({name}, axis={int(b.rng.integers(len(v.shape)))})", "reduce")
    if op in ("any", "all"):
        if not v.exact:
            return None
        return b.add(f"jnp.{op}({name}, axis={axes})", "reduce")
    dims = tuple(range(len(v.shape))) if axes is None else axes
    if op in ("lax_add", "lax_mul") and v.dtype == np.float16:
        # An f16 reduce accumulates in f32 on the IPU (PopLibs), in f16 on
        # XLA:CPU: accepted, pinned by test_accepted_f16_sums_of_a_reduce_...
        # (jnp.sum and jnp.prod upcast f16 on both and are generated).
        return None
    if op == "lax_add" and v.dtype != np.bool_:
        return b.add(f"lax.reduce({name}, {scalar_source(0, v.dtype)}, lax.add, {dims})", "reduce", **inexact)
    if op == "lax_mul" and v.dtype != np.bool_:
        return b.add(f"lax.reduce({name}, {scalar_source(1, v.dtype)}, lax.mul, {dims})", "reduce", **inexact)
    if op == "lax_max" and v.dtype != np.bool_:
        init = scalar_source(-np.inf if v.kind == "f" else np.iinfo(v.dtype).min, v.dtype)
        return b.add(f"lax.reduce({name}, {init}, lax.max, {dims})", "reduce", exact=v.exact, zero_sign=False)
    if op == "lax_xor" and v.kind in "iub":
        return b.add(f"lax.reduce({name}, {scalar_source(0, v.dtype)}, lax.bitwise_xor, {dims})", "reduce")
    return None


# ---------------------------------------------------------------- windows, cumulative ops

def gen_window(b: Builder):
    name = b.pick(lambda v: len(v.shape) >= 1 and v.size > 0 and v.dtype != np.bool_)
    if name is None:
        name = b.new_input(random_shape(b.rng, 1), FLOATS[b.rng.integers(2)])
    v = b.vars[name]
    rng, r = b.rng, len(v.shape)
    if rng.random() < 0.5:
        axis = int(rng.integers(r))
        ops = ["jnp.cumsum({a}, axis={ax})", "lax.cumsum({a}, {ax}, reverse=True)", "jnp.cumprod({a}, axis={ax})",
               "lax.cummax({a}, {ax})", "lax.cummin({a}, {ax}, reverse=True)"]
        if v.kind == "f":
            ops.append("lax.cumlogsumexp({a}, {ax})")
        i = int(rng.integers(len(ops)))
        exact = i in (3, 4) and v.exact
        return b.add(ops[i].format(a=name, ax=axis), "window", exact=exact, zero_sign=False)
    op = ["add", "max", "min"][rng.integers(3)]
    # The init value must be the op's identity: XLA may apply it any number
    # of times (its semantics of reduce and reduce_window).
    if op == "add":
        init = scalar_source(0, v.dtype)
    elif op == "max":
        init = scalar_source(-np.inf if v.kind == "f" else np.iinfo(v.dtype).min, v.dtype)
    else:
        init = scalar_source(np.inf if v.kind == "f" else np.iinfo(v.dtype).max, v.dtype)
    window = tuple(int(rng.integers(1, min(d, 3) + 1)) for d in v.shape)
    strides = tuple(int(rng.integers(1, 3)) for _ in v.shape)
    pad = ["'VALID'", "'SAME'", str([(int(rng.integers(0, 2)), int(rng.integers(0, 2))) for _ in v.shape])][
        rng.integers(3)]
    extra = ""
    if rng.random() < 0.2:
        extra = f", base_dilation={tuple(int(rng.integers(1, 3)) for _ in v.shape)}"
    if rng.random() < 0.2:
        extra += f", window_dilation={tuple(int(rng.integers(1, 3)) for _ in v.shape)}"
    exact = op != "add" and v.exact
    if extra and "base_dilation" in extra and pad != "'VALID'":
        pad = "'VALID'"
    return b.add(f"lax.reduce_window({name}, {init}, lax.{op}, {window}, {strides}, {pad}{extra})", "window",
                 exact=exact, zero_sign=False)


# ---------------------------------------------------------------- dot_general, convolution

def gen_dot(b: Builder):
    rng = b.rng
    dtype = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32), np.dtype(np.int8),
             np.dtype(np.uint8), np.dtype(np.int16)][rng.integers(6)]
    name = b.pick(lambda v: v.dtype == dtype and 1 <= len(v.shape) <= 3 and v.size <= 256)
    if name is None:
        name = b.new_input(random_shape(rng, 1), dtype)
    v = b.vars[name]
    k = v.shape[-1]
    n = int(rng.choice([1, 2, 3, 5, 8]))
    inexact = dict(exact=False, pristine=False, zero_sign=False)
    form = rng.integers(3)
    if form == 0 or len(v.shape) == 1:
        other = b.new_input((k, n) if rng.random() < 0.8 else (k,), dtype)
        pref = ""
        if dtype.kind != "f" and rng.random() < 0.5:
            pref = ", preferred_element_type=np.int32"
        elif dtype == np.float16 and rng.random() < 0.3:
            pref = ", preferred_element_type=np.float32"
        return b.add(f"jnp.matmul({name}, {other}{pref})", "dot", **inexact)
    if form == 1 and len(v.shape) == 3:
        bsz, m, k = v.shape
        other = b.new_input((bsz, n, k), dtype)
        return b.add(f"lax.dot_general({name}, {other}, (((2,), (2,)), ((0,), (0,))))", "dot", **inexact)
    if dtype.kind != "f":
        return None
    # convolution: [N, C, W] or [N, C, H, W]
    spatial = int(rng.integers(1, 3))
    groups = int(rng.choice([1, 1, 2]))
    c = groups * int(rng.integers(1, 3))
    o = groups * int(rng.integers(1, 3))
    lhs_shape = (int(rng.integers(1, 3)), c) + tuple(int(rng.integers(3, 8)) for _ in range(spatial))
    lhs = b.pick(lambda w: w.shape == lhs_shape and w.dtype == dtype) or b.new_input(lhs_shape, dtype)
    kernel = tuple(int(rng.integers(1, 4)) for _ in range(spatial))
    rhs = b.new_input((o, c // groups) + kernel, dtype)
    strides = tuple(int(rng.integers(1, 3)) for _ in range(spatial))
    padding = ["'VALID'", "'SAME'", str([(int(rng.integers(0, 2)), int(rng.integers(0, 2))) for _ in kernel])][
        rng.integers(3)]
    lhs_d = tuple(int(rng.integers(1, 3)) for _ in range(spatial))
    rhs_d = tuple(int(rng.integers(1, 3)) for _ in range(spatial))
    if padding == "'SAME'":
        lhs_d = (1,) * spatial
    return b.add(f"lax.conv_general_dilated({lhs}, {rhs}, {strides}, {padding}, lhs_dilation={lhs_d}, "
                 f"rhs_dilation={rhs_d}, feature_group_count={groups})", "conv", **inexact)


# ---------------------------------------------------------------- gather, scatter, dynamic slices

def gen_gather(b: Builder):
    name = b.pick(lambda v: len(v.shape) >= 1 and v.shape[0] > 0)
    if name is None:
        name = b.new_input(random_shape(b.rng, 1), DTYPES[b.rng.integers(len(DTYPES))])
    v = b.vars[name]
    rng = b.rng
    axis = int(rng.integers(len(v.shape)))
    d = v.shape[axis]
    if d == 0:
        return None
    flags = _result_flags("nature", [v])
    idx_shape = tuple(int(x) for x in rng.choice([1, 2, 3, 5], int(rng.integers(1, 3))))
    form = rng.integers(5)
    if form == 0:
        mode = ["'clip'", "'fill'"][rng.integers(2)]
        idx = b.index_input(idx_shape, -d - 2, d + 2)
        return b.add(f"jnp.take({name}, {idx}, axis={axis}, mode={mode})", "gather", **flags)
    if form == 1:   # promise_in_bounds: indices in range (negative ones count from the end)
        idx = b.index_input(idx_shape, -d, d - 1)
        return b.add(f"{name}[{idx}]" if axis == 0 else f"jnp.take({name}, {idx}, axis={axis})", "gather", **flags)
    if form == 2 and len(v.shape) >= 2:   # two index arrays, broadcast together
        i0 = b.index_input(idx_shape, 0, v.shape[0] - 1)
        i1 = b.index_input(idx_shape[-1:], 0, max(v.shape[1] - 1, 0))
        if v.shape[1] == 0:
            return None
        return b.add(f"{name}[{i0}, {i1}]", "gather", **flags)
    # scatter
    n_upd = int(rng.integers(1, 5))
    unique = rng.random() < 0.6
    if unique and n_upd > d:
        n_upd = d
    mode = ["'drop'", "'clip'", "'promise_in_bounds'"][rng.integers(3)]
    if mode == "'promise_in_bounds'":
        values = rng.choice(d, n_upd, replace=not unique) if d else np.zeros(0)
    else:
        values = rng.choice(np.arange(-d - 2, d + 3), n_upd, replace=not unique)
    idx = b.new_input((n_upd,), np.int32, np.tile(values, (2, 1)) if b.kind == "pmap" else values)
    upd_shape = (n_upd,) + v.shape[:axis] + v.shape[axis + 1:]
    upd_shape = (n_upd,) + v.shape[1:]
    upd = b.new_input(upd_shape, v.dtype)
    op = ["set", "add", "mul", "min", "max"][rng.integers(5)]
    if v.dtype == np.bool_ and op in ("add", "mul"):
        op = "set"
    u = b.vars[upd]
    flags = _result_flags("nature", [v, u])
    if op in ("add", "mul") and v.kind == "f":
        flags = dict(exact=False, pristine=False, zero_sign=False)
    if op in ("min", "max"):
        flags["zero_sign"] = False
    if op == "set" and not unique:
        return None   # which duplicate's update lands is unspecified (XLA)
    extra = ", unique_indices=True" if unique and rng.random() < 0.3 else ""
    return b.add(f"{name}.at[{idx}].{op}({upd}, mode={mode}{extra})", "scatter", **flags)


def gen_dynamic_slice(b: Builder):
    name = b.pick(lambda v: len(v.shape) >= 1)
    if name is None:
        name = b.new_input(random_shape(b.rng, 1), DTYPES[b.rng.integers(len(DTYPES))])
    v = b.vars[name]
    rng = b.rng
    starts = []
    for d in v.shape:
        if rng.random() < 0.5:
            starts.append(b.index_input((), -3, d + 3))
        else:
            starts.append(str(int(rng.integers(-2, d + 3))))
    sizes = tuple(int(rng.integers(0, d + 1)) for d in v.shape)
    flags = _result_flags("nature", [v])
    if rng.random() < 0.5:
        return b.add(f"lax.dynamic_slice({name}, ({', '.join(starts)},), {sizes})", "dynamic_slice", **flags)
    upd = b.new_input(sizes, v.dtype)
    flags = _result_flags("nature", [v, b.vars[upd]])
    return b.add(f"lax.dynamic_update_slice({name}, {upd}, ({', '.join(starts)},))", "dynamic_slice", **flags)


# ---------------------------------------------------------------- sort, top_k

def gen_sort(b: Builder):
    name = b.pick(lambda v: len(v.shape) >= 1 and (v.kind != "f" or (v.exact and v.zero_sign)))
    if name is None:
        name = b.new_input(random_shape(b.rng, 1), DTYPES[b.rng.integers(len(DTYPES))])
    v = b.vars[name]
    rng = b.rng
    axis = int(rng.integers(len(v.shape)))
    form = rng.integers(5)
    flags = _result_flags("nature", [v])
    if form == 0:
        return b.add(f"jnp.sort({name}, axis={axis})", "sort", **flags)
    if form == 1:
        return b.add(f"jnp.argsort({name}, axis={axis}, stable=True)", "sort")
    if form == 2 and v.shape[-1] > 0 and v.dtype != np.bool_:
        k = int(rng.integers(1, v.shape[-1] + 1))
        return b.add(f"lax.top_k({name}, {k})[{int(rng.integers(2))}]", "sort", **flags)
    if form == 3:
        other = b.like(name)
        return b.add(f"lax.sort(({name}, {other}), dimension={axis}, num_keys=1)[1]", "sort",
                     **_result_flags("nature", [b.vars[other]]))
    return b.add(f"jnp.sort({name}, axis={axis}, descending=True)", "sort", **flags)


# ---------------------------------------------------------------- control flow

def _body(b: Builder, var: Var, c: str) -> tuple[str, bool]:
    """An element-wise expression of `c` keeping var's shape and dtype, and
    whether it is exact by nature."""
    dt, rng = var.dtype, b.rng
    if var.kind == "f":
        forms = [(f"{c} * {scalar_source(0.5, dt)} + {scalar_source(1, dt)}", False),
                 (f"jnp.tanh({c}) + {c}", False), (f"jnp.maximum({c}, -{c})", True),
                 (f"jnp.floor({c} * {scalar_source(1.5, dt)})", False), (f"-{c}", True)]
    elif var.kind == "b":
        forms = [(f"~{c}", True), (f"{c} ^ jnp.roll({c}, 1)" if var.shape else f"~{c}", True)]
    else:
        forms = [(f"{c} * {scalar_source(3, dt)} + {scalar_source(1, dt)}", True),
                 (f"{c} ^ lax.shift_right_logical({c}, {scalar_source(1, dt)})", True),
                 (f"jnp.maximum({c}, {scalar_source(2, dt)}) - {scalar_source(1, dt)}", True)]
    return forms[rng.integers(len(forms))]


def gen_control(b: Builder):
    name = b.pick(lambda v: v.kind != "f" or v.exact)
    if name is None:
        name = b.new_input(random_shape(b.rng), DTYPES[b.rng.integers(len(DTYPES))])
    v = b.vars[name]
    rng = b.rng
    body, exact = _body(b, v, "c")
    flags = dict(exact=exact and v.exact, pristine=False, zero_sign=exact and v.zero_sign and "maximum" not in body)
    form = rng.integers(6)
    if form == 0:
        return b.add(f"lax.fori_loop(0, {int(rng.integers(0, 5))}, lambda i, c: {body}, {name})", "control", **flags)
    if form == 1:
        n = b.index_input((), -1, 4)
        return b.add(f"lax.fori_loop(0, {n}, lambda i, c: {body}, {name})", "control", **flags)
    if form == 2:
        limit = int(rng.integers(0, 5))
        return b.add(f"lax.while_loop(lambda s: s[0] < {limit}, lambda s: (s[0] + 1, (lambda c: {body})(s[1])), "
                     f"(np.int32(0), {name}))[1]", "control", **flags)
    if form == 3 or form == 4:
        p = b.pick(lambda w: w.kind != "f" or w.exact)
        pv = b.vars[p]
        pred = f"{p}.ravel()[0] > {scalar_source(0, pv.dtype)}" if pv.size else "True"
        other, exact2 = _body(b, v, "c")
        flags["exact"] = flags["exact"] and exact2
        flags["zero_sign"] = flags["zero_sign"] and exact2 and "maximum" not in other
        if form == 4 and pv.size:
            return b.add(f"lax.switch(jnp.int32({p}.ravel()[0]) % 3, [lambda c: {body}, lambda c: {other}, "
                         f"lambda c: c], {name})", "control", **flags)
        return b.add(f"lax.cond({pred}, lambda c: {body}, lambda c: {other}, {name})", "control", **flags)
    if not v.shape:
        return None
    xs_flags = dict(flags)
    if v.kind == "f":
        xs_flags.update(exact=False, zero_sign=False)
    carry = "lambda c, x: (c + x, c * x)" if v.kind != "b" else "lambda c, x: (c ^ x, c & x)"
    return b.add(f"lax.scan({carry}, {name}[0], {name})[{int(rng.integers(2))}]", "control", **xs_flags)


# ---------------------------------------------------------------- random bits

def gen_random(b: Builder):
    key = b.new_input((2,), np.uint32)
    shape = random_shape(b.rng, 1)
    return b.add(f"jax.random.bits(jax.random.wrap_key_data({key}), {shape}, np.uint32)", "random")


# ---------------------------------------------------------------- collectives (pmap programs)

def gen_collective(b: Builder):
    name = b.pick(lambda v: v.dtype != np.bool_)
    if name is None:
        name = b.new_input(random_shape(b.rng), [np.float32, np.int32, np.float16][b.rng.integers(3)])
    v = b.vars[name]
    rng = b.rng
    r = len(v.shape)
    inexact = dict(exact=False, pristine=False, zero_sign=False)
    form = rng.integers(9)
    if form == 0:
        return b.add(f"lax.psum({name}, 'i')", "collective", **(inexact if v.kind == "f" else {}))
    if form == 1:
        return b.add(f"lax.pmax({name}, 'i')", "collective", exact=v.exact, zero_sign=False)
    if form == 2:
        return b.add(f"lax.pmin({name}, 'i')", "collective", exact=v.exact, zero_sign=False)
    if form == 3:
        return b.add(f"lax.pmean({name}, 'i')", "collective", **inexact)
    if form == 4:
        axis = int(rng.integers(r + 1))
        tiled = r >= 1 and rng.random() < 0.5
        if tiled:
            axis = min(axis, r - 1)
        return b.add(f"lax.all_gather({name}, 'i', axis={axis}, tiled={tiled})", "collective",
                     **_result_flags("nature", [v]))
    if form == 5:
        perm = [[(0, 1), (1, 0)], [(0, 1)], [(1, 1), (0, 0)]][rng.integers(3)]
        return b.add(f"lax.ppermute({name}, 'i', {perm})", "collective", **_result_flags("nature", [v]))
    if form == 6:
        even = [i for i, d in enumerate(v.shape) if d % 2 == 0 and d > 0]
        if not even:
            return None
        split = even[rng.integers(len(even))]
        concat = int(rng.integers(r))
        return b.add(f"lax.all_to_all({name}, 'i', {split}, {concat}, tiled=True)", "collective",
                     **_result_flags("nature", [v]))
    if form == 7:
        even = [i for i, d in enumerate(v.shape) if d % 2 == 0 and d > 0]
        if not even:
            return None
        return b.add(f"lax.psum_scatter({name}, 'i', scatter_dimension={even[rng.integers(len(even))]}, tiled=True)",
                     "collective", **(inexact if v.kind == "f" else {}))
    dt = v.dtype.name
    return b.add(f"{name} + lax.axis_index('i').astype(np.{dt})", "collective",
                 exact=v.exact and v.pristine, pristine=False, zero_sign=v.zero_sign)


FAMILIES = {
    "elementwise": (gen_unary, 3.0), "binary": (gen_binary, 3.0), "select": (gen_select, 1.0),
    "cast": (gen_cast, 1.5), "bitcast": (gen_bitcast, 0.7), "structural": (gen_structural, 1.5),
    "reduce": (gen_reduce, 1.5), "window": (gen_window, 1.5), "dot": (gen_dot, 1.5),
    "gather": (gen_gather, 1.5), "dynamic_slice": (gen_dynamic_slice, 1.0), "sort": (gen_sort, 1.0),
    "control": (gen_control, 1.2), "random": (gen_random, 0.2),
}


def _attempt(b, gen):
    """gen(b)'s result, or None with b as it was before (the proposal was
    rejected, or the generator could not fit it to its operands)."""
    mark = (dict(b.inputs), dict(b.vars), list(b.lines))
    try:
        out = gen(b)
    except Exception:   # noqa: BLE001 (Rejected, or a proposal the generator could not fit to its operands)
        out = None
    if out is None:
        b.inputs, b.vars, b.lines = mark
    return out


def generate(seed: int, max_steps: int = 5, pmap_share: float = 0.08) -> Program:
    rng = np.random.default_rng(seed)
    kind = "pmap" if rng.random() < pmap_share else "jit"
    b = Builder(rng, kind)
    b.special = float(rng.choice([0.0, 0.1, 0.3]))
    main = DTYPES[rng.integers(len(DTYPES))] if rng.random() < 0.8 else np.dtype(np.float32)
    for _ in range(int(rng.integers(1, 3))):
        b.new_input(random_shape(rng), main if rng.random() < 0.8 else DTYPES[rng.integers(len(DTYPES))])
    names, weights = list(FAMILIES), np.array([w for _, w in FAMILIES.values()])
    steps, attempts = int(rng.integers(1, max_steps + 1)), 0
    collective_done = kind != "pmap"
    while len(b.lines) < steps and attempts < 40:
        attempts += 1
        if not collective_done and (len(b.lines) >= steps - 1 or rng.random() < 0.4):
            gen = gen_collective
        else:
            gen = FAMILIES[names[rng.choice(len(names), p=weights / weights.sum())]][0]
        out = _attempt(b, gen)
        if out is None:
            continue
        if gen is gen_collective:
            collective_done = True
    if not b.lines or not collective_done:
        return generate(seed + 10**9, max_steps, pmap_share) if seed < 10**12 else None
    made = [name for name, *_ in b.lines]
    outputs = [made[-1]] + [n for n in made[:-1] if rng.random() < 0.3]
    return Program(b.inputs, b.lines, outputs, b.vars, kind, seed)


# ---------------------------------------------------------------- sizes where the Model changes path

# The IPU Model runs an op one way or another by its size (model/ and
# model/fast/): element-wise chains in chunks, shared with a helper thread,
# handed to XLA:CPU; float16/float32 conversions by XLA:CPU; misaligned
# inputs staged; reductions over short axes element by element; products
# through cblas, in batches, in halves; independent compute sets as lanes;
# small programs on the quick dispatch path. Threshold-sized programs hold
# arrays just below, at and above each of these sizes (read from the code,
# so they follow it), so that every path is compared with XLA:CPU.
def elementwise_thresholds(dtype) -> list[int]:
    """Element counts where an element-wise chain (or a convert) of dtype
    changes path."""
    item = np.dtype(dtype).itemsize
    return sorted({model_elementwise.CHAIN_CHUNK, model_elementwise.SHARED_CHAIN,
                   model_elementwise.FAST_CHAIN_CHUNK, model_elementwise.FAST_SHARED_CHAIN,
                   xla_chains.MIN_ELEMENTS, xla_chains.CONVERT_MIN_ELEMENTS, QUICK_ELEMENTS,
                   xla_chains.STAGING_KEPT // item, lanes.MIN_GROUP_WORK // 2})


# Multiply-adds where a product changes path (cblas calls, their batch
# call, row halves, halves shared under load); and result sizes around
# STACKED_BYTES (partials stacked or summed one by one).
DOT_MACS = sorted({blas.SGEMM_MACS, blas.BATCH_MIN_MACS, blas.SHARED_MACS, blas.BUSY_SHARED_MACS})
SIZED_FAMILIES = {
    "elementwise": (gen_unary, 3.0), "binary": (gen_binary, 3.0), "select": (gen_select, 1.0),
    "cast": (gen_cast, 1.5), "structural": (gen_structural, 0.7), "reduce": (gen_reduce, 1.0),
}


def _near(rng, threshold: int) -> int:
    return max(1, threshold + int(rng.choice([-1, 0, 1, 5, 8])))


def _shape_of(rng, n: int) -> tuple:
    """A shape of n elements: (n,), or two axes when n divides."""
    cols = [c for c in (2, 3, 8, 16, 128) if n % c == 0]
    if not cols or rng.random() < 0.4:
        return (n,)
    c = int(rng.choice(cols))
    return (n // c, c) if rng.random() < 0.7 else (c, n // c)


def _sized_dtype(rng) -> np.dtype:
    # float32 and float16 chains are the ones XLA:CPU takes over.
    return [np.dtype(np.float32), np.dtype(np.float16), DTYPES[rng.integers(len(DTYPES))]][rng.choice(3, p=[.4, .4, .2])]


def gen_sized_dot(b: Builder):
    rng = b.rng
    dtype = np.dtype(np.float32) if rng.random() < 0.8 else np.dtype(np.float16)
    batch = int(rng.choice([1, 1, 2, 3]))
    m = int(rng.choice([31, 32, 33, 64, 100, 257]))
    if rng.random() < 0.3:
        # batch * m * n floats of the result around STACKED_BYTES, over 1-4 chunks of K.
        n = max(1, blas.STACKED_BYTES // 4 // int(rng.choice([1, 2, 4])) // (batch * m)) + int(rng.integers(-2, 3))
        k = int(rng.choice([16, 64, 200, 513]))
    else:
        n = int(rng.choice([1, 8, 17, 64, 128]))
        k = max(1, _near(rng, int(rng.choice(DOT_MACS))) // (batch * m * n))
    lhs = b.new_input((batch, m, k) if batch > 1 else (m, k), dtype)
    rhs = b.new_input((batch, k, n) if batch > 1 else (k, n), dtype)
    inexact = dict(exact=False, pristine=False, zero_sign=False)
    if batch > 1:
        return b.add(f"lax.dot_general({lhs}, {rhs}, (((2,), (1,)), ((0,), (0,))))", "dot", **inexact)
    return b.add(f"jnp.matmul({lhs}, {rhs})", "dot", **inexact)


def generate_sized(seed: int, max_steps: int = 4) -> Program | None:
    """A program whose arrays sit at one of the sizes where the Model
    changes path (element-wise chains and conversions, reductions over a
    short axis, products), with 1-max_steps ops."""
    rng = np.random.default_rng([seed, 1])
    b = Builder(rng)
    b.special = float(rng.choice([0.0, 0.1, 0.3]))
    b.max_elements = 1 << 21
    b.periodic_from = 4 * PERIOD
    kind = rng.choice(["elementwise", "reduce", "dot"], p=[0.6, 0.2, 0.2])
    if kind == "elementwise":
        dtype = _sized_dtype(rng)
        shape = _shape_of(rng, _near(rng, int(rng.choice(elementwise_thresholds(dtype)))))
        for _ in range(int(rng.integers(1, 3))):
            b.new_input(shape, dtype)
    elif kind == "reduce":
        b.reduce_last_axis = True
        rows = _near(rng, model_reduce.SHORT_AXIS_ROWS) * int(rng.choice([1, 1, 3]))
        axis = int(rng.choice([2, 3, model_reduce.SHORT_AXIS, model_reduce.SHORT_AXIS + 1]))
        lead = (int(rng.choice([2, 5])),) if rng.random() < 0.3 else ()
        b.new_input(lead + (rows, axis), _sized_dtype(rng))
    names, weights = list(SIZED_FAMILIES), np.array([w for _, w in SIZED_FAMILIES.values()])
    steps, attempts = int(rng.integers(1, max_steps + 1)), 0
    while len(b.lines) < steps and attempts < 40:
        attempts += 1
        if kind == "dot" and not b.lines:
            gen = gen_sized_dot
        elif kind == "reduce" and not b.lines:
            gen = gen_reduce
        else:
            gen = SIZED_FAMILIES[names[rng.choice(len(names), p=weights / weights.sum())]][0]
        _attempt(b, gen)
    if not b.lines:
        return None
    made = [name for name, *_ in b.lines]
    outputs = [made[-1]] + [n for n in made[:-1] if rng.random() < 0.4]
    return Program(b.inputs, b.lines, outputs, b.vars, "jit", seed)
