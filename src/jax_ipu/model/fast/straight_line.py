"""A program without control flow run as one generated function: its
steps called one after the other (small programs run on every call, where
the loops of Engine.run show), each intermediate dropped after the last
step that refers to it, and the helper thread woken before the steps that
share work and let sleep through long stretches without any, as the
steps' times in the program's first runs say."""
from __future__ import annotations

import time

import numpy as np

from jax_ipu.graph.program import Program
from jax_ipu.graph.records import tensor_ids
from jax_ipu.model.fast import helper
from jax_ipu.model.fast.lazy_copies import refs

# Whether a straight-line run drops each intermediate after the last step
# that refers to it (the host holds the live values, not every value the
# program ever made); off only to measure what that saves.
FREE_DEAD = True
# The helper thread, asleep, takes a while to wake: a straight-line
# program wakes it this long (as its steps took, in microseconds) before
# a step that shares work...
PREWAKE_US = 150.0
# ... and lets it sleep through stretches without shared work at least this
# long: a spinning helper slows the caller's own work (the cores share more
# than they show), which over such a stretch costs more than waking it again.
IDLE_US = 2000.0
# Runs of a straight-line program whose steps are timed (the fastest of
# them counts) before its helper schedule is made.
TIMED_RUNS = 2


def helper_schedule(fns: list, est: list) -> tuple[set, set]:
    """(positions before which the helper is woken, positions after which
    it goes back to sleep) in a straight-line program's steps, est[i] the
    microseconds step i took: it spins only around the steps that share
    work (fn.shares)."""
    shares = [i for i, fn in enumerate(fns) if getattr(fn, "shares", False)]
    wake, rest = set(), set()
    previous = -1
    for j in shares:
        if previous >= 0 and sum(est[previous + 1:j]) < IDLE_US:
            previous = j
            continue          # it keeps spinning through a short stretch
        if previous >= 0:
            rest.add(previous)
        k, ahead = j, 0.0
        while k > previous + 1 and ahead < PREWAKE_US:
            k -= 1
            ahead += est[k]
        wake.add(k)
        previous = j
    if previous >= 0:
        rest.add(previous)
    return wake, rest


def dead_after(program: Program, covers: list, lazy: dict) -> list:
    """Per top-level function (covers[j]: the steps it runs), the tensors
    no later function refers to (through lazy Copies' sources too) and the
    run does not return."""
    returned = set()
    for t in tensor_ids(program.outputs, []):
        returned.add(t)
        returned.update(tensor_ids(lazy.get(t), []))
    last = {}
    for j, steps in enumerate(covers):
        for s in steps:
            for t in refs(s, []):
                last[t] = j
                if t in lazy:
                    for u in tensor_ids(lazy[t], []):
                        last[u] = j
    dead = [[] for _ in covers]
    for t, j in last.items():
        if t not in returned:
            dead[j].append(t)
    return dead


def straight_line(loaded, timed: bool = False):
    """fn(inputs, alias) -> outputs running a loaded program (model.engine)
    without control flow. timed: each step's time kept in loaded.step_us;
    else the helper thread is woken and let sleep as helper_schedule says
    from step_us."""
    env = {"template": loaded.template, "np": np, "wake": helper.begin_session, "rest": helper.end_session,
           "clock": time.perf_counter, "took": loaded.step_us}
    lines = ["def run(inputs, alias=()):", "    state = template.copy()"]
    lines += [f"    state[{tid}] = inputs[{i}]" for i, tid in enumerate(loaded.input_ids)]
    lines += ["    for o, i in alias:", "        state[o] = state[i]"]    # donated buffers, written in place
    wake, rest = (set(), set()) if timed else helper_schedule(loaded.steps, loaded.step_us)
    if timed:
        lines.append("    t = clock()")
    for i, fn in enumerate(loaded.steps):
        env[f"s{i}"] = fn
        if i in wake:
            lines.append("    wake()")
        lines.append(f"    s{i}(state)")
        if loaded.dead is not None and loaded.dead[i]:
            lines.append("    " + " = ".join(f"state[{t}]" for t in loaded.dead[i]) + " = None")
        if timed:
            lines.append(f"    u = clock(); took[{i}] = min(took[{i}], (u - t) * 1e6); t = u")
        if i in rest:
            lines.append("    rest()")
    results = []
    for j, (view, (get, copy)) in enumerate(zip(loaded.output_views, loaded.outputs, strict=True)):
        if view.is_whole_tensor and view.shape == view.tensor.shape:
            value = f"state[{view.tensor.id}]"
        else:
            env[f"g{j}"] = get
            value = f"g{j}(state)"
        results.append(f"np.array({value})" if copy else value)
    lines.append(f"    return [{', '.join(results)}]")
    exec(compile("\n".join(lines), f"<program {loaded.name}>", "exec"), env)
    return env["run"]
