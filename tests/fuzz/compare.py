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
  largest finite magnitude among the output's CPU values and 1.
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
  subnormals), is the `subnormal intermediate` one too. The float64
  comparisons accept a difference only where XLA:CPU's result is beyond
  the tolerances of the float64 computation and the ipu's within them. A difference
  where the ipu agrees with the float64 computation and no subnormal is
  involved is the accepted `xla:cpu off ieee` one (XLA:CPU's division of
  -inf by -3.4e38 is NaN; IEEE and the ipu: +inf). Outputs computed from a
  division by a float32 constant whose reciprocal is subnormal differ as
  the accepted `xla:cpu reciprocal` one: XLA:CPU multiplies by the
  reciprocal, flushed to zero (x / -3.4e38 is -0.0, and NaN for -inf).
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


def run(program, device_or_devices, cpu, inputs=None):
    """(ipu results, cpu results): lists of numpy arrays, or an exception."""
    f = program.function()
    args = list((inputs if inputs is not None else program.inputs).values())
    results = []
    for platform in ("ipu", "cpu"):
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


def _mismatch_floats(got: np.ndarray, want: np.ndarray, var) -> np.ndarray:
    """Boolean mask of elements that break the float rules."""
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
    scale = max(float(finite_w.max()) if finite_w.size else 0.0, 1.0)
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
            bad = _mismatch_floats(g, w, var)
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
    q.lines = [(name, expr.replace("np.float32(", "np.float64("), family) for name, expr, family in program.lines]
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


def check(program, ipus, cpu) -> Outcome:
    got, want = run(program, ipus, cpu)
    outcome = compare_results(program, got, want)
    if outcome.status == "mismatch":
        inputs = flushed(program.inputs)
        if inputs is not None:
            got2, _ = run(program, ipus, cpu, inputs)
            if compare_results(program, got2, want).status == "ok":
                return Outcome("accepted", outcome.detail, "subnormal")
        if any("bitcast_convert_type" in expr and program.vars[name].dtype == np.float32
               for name, expr, _ in program.lines):    # where integers' bits make f32 subnormals
            q = _flushing(program)
            got3, want3 = run(q, ipus, cpu, inputs)
            if compare_results(q, got3, want3).status == "ok":
                return Outcome("accepted", outcome.detail, "subnormal intermediate")
        kind = _f64_explains(program, got, want, cpu)
        if kind is not None:
            return Outcome("accepted", outcome.detail, kind)
        rounded = _f16_rounded_on_cpu(program, cpu)
        if rounded is not None and compare_results(program, got, rounded).status == "ok":
            return Outcome("accepted", outcome.detail, "f16 rounding")
        if outcome.names and set(outcome.names) <= _after_huge_divisor(program):
            return Outcome("accepted", outcome.detail, "xla:cpu reciprocal")
    return outcome
