"""Shrinking a failing Program to a small reproducer that fails the same way.

Steps, each kept only if the program still fails with the same status:
1. keep one failing output;
2. drop the lines no output needs, and the inputs no line reads;
3. cut the program: a line whose operands come from other lines gets those
   operands as inputs holding their CPU values (so the failing op is left
   with inputs alone);
4. simplify input values: halves of each input set to zero, then to one.
"""
from __future__ import annotations

import copy
import re

import jax
import numpy as np

from compare import check

_NAME = re.compile(r"\bv\d+\b")


def _reads(expr: str) -> set:
    return set(_NAME.findall(expr))


def _prune(p):
    needed = set(p.outputs)
    lines = []
    for name, expr, family in reversed(p.lines):
        if name in needed:
            lines.append((name, expr, family))
            needed |= _reads(expr)
    q = copy.copy(p)
    q.lines = list(reversed(lines))
    q.inputs = {k: v for k, v in p.inputs.items() if k in needed}
    return q


def _cpu_values(p, cpu) -> dict:
    """Every line's value on XLA:CPU (as the Program's per-device layout)."""
    q = copy.copy(p)
    q.outputs = [name for name, *_ in p.lines]
    f = q.function()
    args = jax.device_put(list(p.inputs.values()), cpu)
    out = jax.jit(jax.vmap(f, axis_name="i") if p.kind == "pmap" else f)(*args)
    return {name: np.asarray(v) for name, v in zip(q.outputs, out, strict=True)}


def minimise(program, ipus, cpu, status: str, budget: int = 60):
    tries = [0]

    def fails(q) -> bool:
        if tries[0] >= budget:
            return False
        tries[0] += 1
        try:
            return check(q, ipus, cpu).status == status
        except Exception:   # noqa: BLE001 (a broken candidate is not a reproducer)
            return False

    p = _prune(program)
    if len(p.outputs) > 1:
        for out in p.outputs:
            q = copy.copy(p)
            q.outputs = [out]
            q = _prune(q)
            if fails(q):
                p = q
                break
    try:
        values = _cpu_values(p, cpu)
    except Exception:   # noqa: BLE001
        values = {}
    for _, expr, _ in reversed(list(p.lines)):
        operands = [r for r in _reads(expr) if r in values]
        if not operands:
            continue
        q = copy.copy(p)
        q.inputs = dict(p.inputs)
        for r in operands:
            q.inputs[r] = values[r]
        q.lines = [line for line in p.lines if line[0] not in operands]
        q = _prune(q)
        q.inputs = {k: q.inputs[k] for k in sorted(q.inputs, key=lambda k: int(k[1:]))}
        if fails(q):
            p = q
    for k in list(p.inputs):
        for fill in (0, 1):
            a = p.inputs[k]
            n = a.size
            step = n
            while step >= 1 and a.size:
                changed = False
                for start in range(0, n, step):
                    b = a.copy().reshape(-1)
                    if (b[start:start + step] == fill).all():
                        continue
                    b[start:start + step] = fill
                    q = copy.copy(p)
                    q.inputs = dict(p.inputs)
                    q.inputs[k] = b.reshape(a.shape)
                    if fails(q):
                        p, a, changed = q, q.inputs[k], True
                if step == 1 or tries[0] >= budget:
                    break
                step = max(step // 2, 1) if not changed or step > 1 else step
    return p
