"""Running a Program on ipu and on XLA:CPU, and the rules comparing them.

Rules (docs/fuzzing.md lists them with the accepted differences):
- Every output has the CPU's shape and dtype.
- Integers and bools: equal, element by element.
- Floats the generator marks exact (programs.py): equal bits, except that
  any NaN equals any NaN (payloads and signs of NaNs are not compared) and,
  where the value's `zero_sign` is off (after max/min, reductions, ...),
  -0.0 equals +0.0.
- Other floats: NaN where the CPU has NaN; an infinity where the CPU has
  that infinity, except that a value beyond half the largest finite one
  may be an infinity on the other side (an overflow decided by a rounding);
  elsewhere |ipu - cpu| <= RTOL * |cpu| + RTOL * scale, scale being the
  largest finite magnitude among the output's CPU values and 1 (and, for
  a value computed from sums, of those sums on the CPU: its error is its
  terms', as clamp(dot, -2, 1) of a dot that cancels shows).
- float32 subnormals: XLA:CPU's compiled kernels treat subnormal inputs as
  zero and flush subnormal results (DAZ/FTZ); the IPU Model keeps them
  where it runs an op on numpy. So values below the smallest normal f32
  compare as zero, and a program whose inputs hold subnormals is compared
  again with those inputs flushed to zero on the ipu side: agreement then
  counts the difference as the accepted `subnormal` one. A difference
  that remains, in a program where a float32 value falls among the
  subnormals when computed in float64 on the CPU, and whose ipu results
  agree (within the float tolerances) with that float64 computation, is
  the accepted `subnormal intermediate` one: XLA:CPU flushed a subnormal
  result the IPU Model kept. So is a difference that disappears when every
  float32 value a line makes is flushed of subnormals on both backends,
  in a program that bitcasts integers to float32 (small integers' bits are
  subnormals) or takes nextafter of float32 values, is the `subnormal
  intermediate` one too. The float64
  comparisons accept a difference only where XLA:CPU's result is beyond
  the tolerances of the float64 computation and the ipu's within them. A difference
  where the ipu agrees with the float64 computation and no subnormal is
  involved is the accepted `xla:cpu off ieee` one (XLA:CPU's division of
  -inf by -3.4e38 is NaN; IEEE and the ipu: +inf). Outputs computed from a
  division by a float32 constant whose reciprocal is subnormal differ as
  the accepted `xla:cpu reciprocal` one: XLA:CPU multiplies by the
  reciprocal, flushed to zero (x / -3.4e38 is -0.0, and NaN for -inf).
- max and min reductions (jnp.max, lax.reduce, reduce_window) of float
  arrays holding a NaN: XLA:CPU's vectorised kernels may drop the NaN
  (openxla/xla#21461; which elements lose it depends on the host's vector
  width) where XLA's semantics, numpy and the ipu keep it. A difference
  that disappears when the CPU computes those reductions with the NaN put
  back (programs.NAMESPACE's _nan_max...) is the accepted `xla:cpu drops
  nan` one.
- An overflow whose outcome the order of a sum decides (or whether a
  product is rounded before it is added): in a value compared within
  tolerances and computed through a sum (a dot, a convolution, a
  reduction, a window, a loop), NaN or an infinity on one side against
  anything else on the other, in a program whose inputs hold finite values
  beyond a quarter of the largest (max + max overflows before a -inf is added, or after; a
  product of two such values overflows unless fused): the accepted
  `overflow order` one.
- float16: a difference that disappears when the CPU rounds every f16
  value a line makes to f16 (an optimization barrier after each such line,
  so XLA:CPU cannot keep a fusion's f16 intermediates in f32) is the
  accepted `f16 rounding` one: the IPU rounds every f16 op.
"""
from __future__ import annotations

import copy
import dataclasses
import re

import jax
import numpy as np

RTOL = {np.dtype(np.float32): 2e-4, np.dtype(np.float16): 2e-2}


@dataclasses.dataclass
class Outcome:
    status: str                  # ok | accepted | mismatch | ipu_error | cpu_error | both_error | jax_error
    detail: str = ""
    accepted: str = ""           # which accepted difference, if status == accepted
    names: tuple = ()            # the outputs that differ, for a mismatch


def run(program, device_or_devices, cpu, inputs=None, cpu_program=None, platforms=("ipu", "cpu")):
    """Results on each of `platforms` (by default [ipu results, cpu
    results]): lists of numpy arrays, or an exception. `cpu_program`:
    another formulation of the program for the CPU."""
    args = list((inputs if inputs is not None else program.inputs).values())
    results = []
    for platform in platforms:
        f = (cpu_program if platform == "cpu" and cpu_program is not None else program).function()
        try:
            if program.kind == "pmap":
                if platform == "ipu":
                    out = jax.pmap(f, axis_name="i", devices=device_or_devices)(*args)
                else:
                    out = jax.jit(jax.vmap(f, axis_name="i"))(*jax.device_put(args, cpu))
            else:
                device = device_or_devices[0] if platform == "ipu" else cpu
                out = jax.jit(f)(*jax.device_put(args, device))
            results.append([np.asarray(o) for o in out])
        except Exception as e:   # noqa: BLE001 (an error is an outcome to compare)
            results.append(e)
    return results


def _mismatch_floats(got: np.ndarray, want: np.ndarray, var, scale: float = 0.0) -> np.ndarray:
    """Boolean mask of elements that break the float rules (`scale`: the
    magnitude of the sums the value comes from, when larger than its own)."""
    dtype = want.dtype
    tiny = np.finfo(dtype).tiny if dtype == np.float32 else 0.0
    g = np.where(np.abs(got) < tiny, np.copysign(np.zeros((), dtype), got), got).astype(np.float64)
    w = np.where(np.abs(want) < tiny, np.copysign(np.zeros((), dtype), want), want).astype(np.float64)
    gnan, wnan = np.isnan(g), np.isnan(w)
    bad = gnan != wnan
    both = ~gnan & ~wnan
    if var.exact:
        bad |= both & (g != w)
        if var.zero_sign:
            bad |= both & (g == 0) & (w == 0) & (np.signbit(g) != np.signbit(w))
        return bad
    big = np.finfo(dtype).max / 2
    ginf, winf = np.isinf(g), np.isinf(w)
    overflow = (ginf & ~winf & (np.abs(w) > big)) | (winf & ~ginf & (np.abs(g) > big)) | \
               (ginf & winf & (g == w))
    finite = both & ~ginf & ~winf
    finite_w = np.abs(w[np.isfinite(w)])
    scale = max(float(finite_w.max()) if finite_w.size else 0.0, 1.0, scale)
    rtol = RTOL[np.dtype(dtype)]
    with np.errstate(invalid="ignore"):     # inf - inf where both overflowed (masked out above)
        close = np.abs(g - w) <= rtol * np.abs(w) + rtol * scale
    bad |= both & ~overflow & ~(finite & close)
    return bad


def compare_results(program, got, want) -> Outcome:
    if isinstance(want, Exception) and isinstance(got, Exception):
        return Outcome("both_error", f"{type(got).__name__}: {got}"[:300])
    if isinstance(want, Exception):
        return Outcome("cpu_error", f"{type(want).__name__}: {want}"[:300])
    if isinstance(got, Exception):
        if isinstance(got, ValueError) and str(got).startswith("Cannot lower jaxpr"):
            # JAX's own pmap lowering refused it before any backend saw it
            # (all_gather of a zero-size axis); the vmap reference has no such check
            return Outcome("jax_error", f"{type(got).__name__}: {got}"[:300])
        return Outcome("ipu_error", f"{type(got).__name__}: {got}"[:2000])
    problems = []
    for name, g, w in zip(program.outputs, got, want, strict=True):
        var = program.vars[name]
        if g.shape != w.shape or g.dtype != w.dtype:
            problems.append(f"{name}: ipu {g.dtype}{list(g.shape)}, cpu {w.dtype}{list(w.shape)}")
            continue
        if w.dtype.kind == "f":
            bad = _mismatch_floats(g, w, var, getattr(program, "scales", {}).get(name, 0.0))
        else:
            bad = g != w
        if bad.any():
            where = np.argwhere(bad)[:3]
            shown = ", ".join(f"{tuple(int(i) for i in ix)}: ipu {g[tuple(ix)]!r} cpu {w[tuple(ix)]!r}"
                              for ix in where)
            problems.append(f"{name} ({'exact' if var.exact else 'tolerance'}, {int(bad.sum())} of {bad.size} "
                            f"differ): {shown}")
    if problems:
        return Outcome("mismatch", "; ".join(problems), names=tuple(p.split(" ", 1)[0].rstrip(":") for p in problems))
    return Outcome("ok")


def flushed(inputs: dict) -> dict | None:
    """The inputs with float32 subnormals made zeros of their sign, or None
    if there are none."""
    out, changed = {}, False
    tiny = np.finfo(np.float32).tiny
    for k, a in inputs.items():
        if a.dtype == np.float32:
            sub = (a != 0) & (np.abs(a) < tiny)
            if sub.any():
                a = np.where(sub, np.copysign(np.float32(0), a), a).astype(np.float32)
                changed = True
        out[k] = a
    return out if changed else None


def _f64_values(program, cpu) -> dict | None:
    """Every line's value on XLA:CPU with the float32 inputs as float64
    (x64 mode), where no float32 subnormal is flushed; None when the
    program does not run so (an op asking for equal float32 types)."""
    if program.kind != "jit":
        return None
    q = copy.copy(program)
    q.outputs = [name for name, *_ in program.lines]
    # float32 literals as float64 ones, so that ops asking for equal types
    # (lax.div, lax.reduce's init) take them
    # and each float32 value underflowing to zero where float32 would (the
    # float64 value of -1e-38 * 1e-40 is no zero, its float32 value is)
    q.lines = [(name, (f"_underflow32({expr})" if program.vars[name].dtype == np.float32 else expr)
                .replace("np.float32(", "np.float64("), family) for name, expr, family in program.lines]
    try:
        with jax.enable_x64(True):
            args = [a.astype(np.float64) if a.dtype == np.float32 else a for a in program.inputs.values()]
            out = jax.jit(q.function())(*jax.device_put(args, cpu))
            return {name: np.asarray(v) for name, v in zip(q.outputs, out, strict=True)}
    except Exception:   # noqa: BLE001
        return None


def _f64_explains(program, got, want, cpu) -> str | None:
    """When the ipu's results agree, within the float tolerances, with the
    program computed in float64 on the CPU (where XLA:CPU's float32 ones do
    not): "subnormal intermediate" if some float32 value falls among f32's
    subnormals there (XLA:CPU flushed a subnormal result the IPU Model
    kept), else "xla:cpu off ieee" (XLA:CPU's float32 arithmetic strays from
    IEEE where the IPU's does not: its division of inf by the largest float
    is NaN). None otherwise."""
    values = _f64_values(program, cpu)
    if values is None:
        return None
    loose = copy.copy(program)
    loose.vars = {n: dataclasses.replace(v, exact=False, zero_sign=False) for n, v in program.vars.items()}
    exact = [values[o].astype(program.vars[o].dtype) for o in program.outputs]
    with np.errstate(all="ignore"):
        # the ipu within the tolerances of the float64 computation, and
        # XLA:CPU beyond them (else a small ipu error would pass as its own)
        if compare_results(loose, got, exact).status != "ok" or compare_results(loose, want, exact).status == "ok":
            return None
    tiny = np.finfo(np.float32).tiny
    if any(program.vars[n].dtype == np.float32 and v.dtype.kind == "f" and np.any((v != 0) & (np.abs(v) < tiny))
           for n, v in values.items()):
        return "subnormal intermediate"
    return "xla:cpu off ieee"


def _flushing(program):
    """The program with every float32 value it makes flushed of subnormals
    (programs.NAMESPACE's _ftz), as XLA:CPU flushes them: run on both
    backends, a difference that came from a kept subnormal disappears."""
    q = copy.copy(program)
    q.lines = [(name, f"_ftz({expr})" if program.vars[name].dtype == np.float32 else expr, family)
               for name, expr, family in program.lines]
    return q


_LITERAL_DIVISION = re.compile(r"lax\.div\((v\d+), np\.float32\(([^()]*)\)\)")


def _after_huge_divisor(program) -> set:
    """The values computed from a division by a float32 constant whose
    reciprocal is subnormal: XLA:CPU divides by multiplying with the
    reciprocal, flushed to zero, so x / -3.4e38 is -0.0 for every finite x
    and NaN for -inf (IEEE, and the ipu: x's quotient, and +inf)."""
    tiny = np.finfo(np.float32).tiny
    tainted = set()
    for name, expr, _ in program.lines:
        for _, literal in _LITERAL_DIVISION.findall(expr):
            value = float(eval(literal, {"inf": np.inf, "nan": np.nan}))   # (the generator's own repr)
            if np.isfinite(value) and abs(value) * tiny >= 1:
                tainted.add(name)
        if re.findall(r"\bv\d+\b", expr) and tainted & set(re.findall(r"\bv\d+\b", expr)):
            tainted.add(name)
    return tainted


def _f16_rounded_on_cpu(program, cpu) -> list | None:
    """The CPU's results with every float16 value a line makes rounded to
    float16 (an optimization barrier after each such line keeps XLA:CPU
    from fusing it with the next in float32), as the IPU rounds every f16
    op; None if it does not run."""
    if program.kind != "jit" or not any(v.dtype == np.float16 for v in program.vars.values()):
        return None
    q = copy.copy(program)
    q.lines = [(name, f"lax.optimization_barrier({expr})" if program.vars[name].dtype == np.float16 else expr, family)
               for name, expr, family in program.lines]
    try:
        out = jax.jit(q.function())(*jax.device_put(list(program.inputs.values()), cpu))
        return [np.asarray(o) for o in out]
    except Exception:   # noqa: BLE001
        return None


_MAX_MIN_REDUCTIONS = [(re.compile(r"\bjnp\.max\("), "_nan_max("), (re.compile(r"\bjnp\.min\("), "_nan_min("),
                       (re.compile(r"\blax\.reduce\("), "_nan_reduce("),
                       (re.compile(r"\blax\.reduce_window\("), "_nan_reduce_window(")]


def _nan_kept(program):
    """The program with every max or min reduction giving NaN where its
    operand holds one (XLA's semantics, which XLA:CPU's vectorised kernels
    may break), for the CPU; None when it has no such reduction."""
    q = copy.copy(program)
    q.lines = []
    for name, expr, family in program.lines:
        if family in ("reduce", "window"):
            for pattern, replacement in _MAX_MIN_REDUCTIONS:
                expr = pattern.sub(replacement, expr)
        q.lines.append((name, expr, family))
    return None if q.lines == program.lines or program.kind != "jit" else q


# Families whose ops sum (or multiply) many terms in an order of their own.
_SUMMING = {"dot", "conv", "reduce", "window", "collective", "control"}


def _from_sums(program) -> set:
    """The values computed, at some step, by an op that sums terms."""
    found = set()
    for name, expr, family in program.lines:
        if family in _SUMMING or found & set(re.findall(r"\bv\d+\b", expr)):
            found.add(name)
    return found


def _overflow_order(program, got, want, lines=None) -> bool:
    """Whether every difference has NaN or an infinity on one side at
    least, in values compared within tolerances, of a program whose float
    inputs hold finite values beyond a quarter of the largest: an overflow
    that the order of a sum, or a product rounded before it is added,
    decides. `lines`: fn() -> (every line's values on the ipu, on the
    cpu), to accept too a finite difference where a sum the value comes
    from (of its shape) is NaN or infinite on one side (clamp(dot, -2, 1):
    1 where the dot's order made +inf, -2 where it made -inf)."""
    big = any(a.dtype.kind == "f" and np.any(np.isfinite(a) & (np.abs(a) > np.finfo(a.dtype).max / 4))
              for a in program.inputs.values())
    if not big:
        return False
    summed = _from_sums(program)
    values = None
    for name, g, w in zip(program.outputs, got, want, strict=True):
        if w.dtype.kind != "f":
            if not np.array_equal(g, w):
                return False
            continue
        bad = _mismatch_floats(g, w, program.vars[name], getattr(program, "scales", {}).get(name, 0.0))
        if not bad.any():
            continue
        if program.vars[name].exact or name not in summed:
            return False
        with np.errstate(invalid="ignore"):
            explained = ~np.isfinite(g.astype(np.float64)) | ~np.isfinite(w.astype(np.float64))
        if not explained[bad].all() and lines is not None:
            values = lines() if values is None else values
            if values is None:
                return False
            for source in _sources(program, name) & summed:
                vg, vw = values[0][source], values[1][source]
                if vg.shape == g.shape:
                    with np.errstate(invalid="ignore"):
                        explained |= (~np.isfinite(vg.astype(np.float64)) | ~np.isfinite(vw.astype(np.float64))) \
                            & ~((vg == vw) | (np.isnan(vg) & np.isnan(vw)))
        if not explained[bad].all():
            return False
    return True


def _sources(program, name: str) -> set:
    """The lines `name` is computed from, itself included."""
    reads = {n: set(re.findall(r"\bv\d+\b", expr)) for n, expr, _ in program.lines}
    found, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n not in found:
            found.add(n)
            todo.extend(reads.get(n, ()))
    return found


def _line_values(program, ipus, cpu, inputs=None, cpu_program=None):
    """({line: ipu value}, {line: cpu value}) of every line, or None."""
    q, r = copy.copy(program), copy.copy(cpu_program or program)
    q.outputs = r.outputs = [name for name, *_ in program.lines]
    got, want = run(q, ipus, cpu, inputs, cpu_program=r)
    if isinstance(got, Exception) or isinstance(want, Exception):
        return None
    return dict(zip(q.outputs, got, strict=True)), dict(zip(q.outputs, want, strict=True))


def _with_sum_scales(program, cpu):
    """The program with, for each inexact float output computed from sums,
    the largest finite magnitude of those sums on the CPU: such a value is
    compared at its terms' scale (clamp(dot, -2, 1) of a dot whose terms
    reach 1e38 and cancel); None when there is none."""
    summed = _from_sums(program)
    names = [n for n in program.outputs if program.vars[n].dtype.kind == "f" and not program.vars[n].exact
             and n in summed]
    if not names or program.kind != "jit":
        return None
    q = copy.copy(program)
    q.outputs = sorted(summed, key=lambda n: int(n[1:]))
    try:
        values = dict(zip(q.outputs, (np.asarray(v) for v in jax.jit(q.function())(
            *jax.device_put(list(program.inputs.values()), cpu))), strict=True))
    except Exception:   # noqa: BLE001
        return None
    scales = {}
    for name in names:
        sizes = [float(np.abs(v[np.isfinite(v)]).max()) for source in _sources(program, name) & summed
                 if (v := values[source]).dtype.kind == "f" and np.isfinite(v).any()]
        scales[name] = max(sizes, default=0.0)
    scaled = copy.copy(program)
    scaled.scales = scales
    return scaled


def check(program, ipus, cpu) -> Outcome:
    got, want = run(program, ipus, cpu)
    outcome = compare_results(program, got, want)
    if outcome.status != "mismatch":
        return outcome
    scaled = _with_sum_scales(program, cpu)
    if scaled is not None:
        program = scaled
        outcome = compare_results(program, got, want)
        if outcome.status != "mismatch":
            return outcome
    reference = _nan_kept(program)
    if reference is not None:
        [kept] = run(reference, ipus, cpu, platforms=("cpu",))
        if not isinstance(kept, Exception) and compare_results(program, kept, want).status != "ok":
            # XLA:CPU dropped a NaN: the other rules compare with its NaN put back.
            if compare_results(program, got, kept).status == "ok":
                return Outcome("accepted", outcome.detail, "xla:cpu drops nan")
            kind = _accepted(program, reference, got, kept, ipus, cpu, outcome)
            return outcome if kind is None else Outcome("accepted", outcome.detail, "xla:cpu drops nan, " + kind)
    kind = _accepted(program, program, got, want, ipus, cpu, outcome)
    return outcome if kind is None else Outcome("accepted", outcome.detail, kind)


def _accepted(program, reference, got, want, ipus, cpu, outcome) -> str | None:
    """Which accepted difference explains the program's results (`reference`:
    the program as the CPU runs it), or None. An overflow decided by a
    sum's order may come on top of another one."""
    # (accepted so far, program, ipu results, cpu results, fn() -> every line's values)
    pairs = [("", program, got, want, lambda: _line_values(program, ipus, cpu, cpu_program=reference))]
    inputs = flushed(program.inputs)
    if inputs is not None:
        got2, _ = run(program, ipus, cpu, inputs, cpu_program=reference)
        if compare_results(program, got2, want).status == "ok":
            return "subnormal"
        pairs.append(("subnormal", program, got2, want, None))
    if any(("bitcast_convert_type" in expr or "nextafter" in expr) and program.vars[name].dtype == np.float32
           for name, expr, _ in program.lines):    # where bits make f32 subnormals
        q = _flushing(program)
        got3, want3 = run(q, ipus, cpu, inputs, cpu_program=_flushing(reference))
        if compare_results(q, got3, want3).status == "ok":
            return "subnormal intermediate"
        pairs.append(("subnormal intermediate", q, got3, want3, None))
    kind = _f64_explains(reference, got, want, cpu)
    if kind is not None:
        return kind
    rounded = _f16_rounded_on_cpu(reference, cpu)
    if rounded is not None:
        if compare_results(program, got, rounded).status == "ok":
            return "f16 rounding"
        pairs.append(("f16 rounding", program, got, rounded, None))
    if outcome.names and set(outcome.names) <= _after_huge_divisor(program):
        return "xla:cpu reciprocal"
    # An overflow's order on top of the explanation that leaves the fewest differences.
    found = [(_differences(q, g, w), i, kind) for i, (kind, q, g, w, lines) in enumerate(pairs)
             if not isinstance(g, Exception) and not isinstance(w, Exception) and _overflow_order(q, g, w, lines)]
    if not found:
        return None
    kind = min(found)[2]
    return f"{kind}, overflow order" if kind else "overflow order"


def _differences(program, got, want) -> int:
    scales = getattr(program, "scales", {})
    return sum(int((_mismatch_floats(g, w, program.vars[n], scales.get(n, 0.0)) if w.dtype.kind == "f" else g != w)
                   .sum()) for n, g, w in zip(program.outputs, got, want, strict=True))
