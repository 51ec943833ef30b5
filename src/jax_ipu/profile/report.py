"""The report of one program's run: a plain dict, written as JSON.

    format            "jax-ipu-profile/1"
    program, device   the program's name (jit_f) and the device id (None when
                      it did not compile)
    compiled          False for a program that does not fit in memory: then
                      `error` is the compiler's message, and there is no run
                      (no steps; cycles are the static estimate)
    target            the modelled IPU: name, tiles, SRAM per tile, clock, host link
    memory            fits, the busiest tile and its bytes, totals, and per tile
                      (lists indexed by tile): always_live (= arguments +
                      constants + code, which holds vertex state),
                      not_always_live_peak and peak, and the largest tensor
                      on each (an index into largest_tensor_names, -1 for
                      none, and its bytes there); the largest tensors on the
                      busiest tile; over_limit: the tiles over the limit
                      (worst first, at most MAX_OVER_TILES) with their bytes
                      and largest tensors; liveness: the not-always-live
                      bytes of all tiles (and of them, exchange buffers; and
                      on the busiest tile) at each top-level program step
                      (a loop is one step), the peak step and the tensors
                      live there
    compute_sets      per compute set in the program: vertices, tiles, codelets,
                      estimated cycles and exchanged bytes
    steps             the last run's executed steps in order (Execute or Copy):
                      name, cycles (with their exchange and sync parts),
                      exchanged bytes; loops appear once per iteration
    program_tree      the program (Sequence, Repeat, RepeatWhileTrue, If,
                      Switch, Call down to Execute, Copy and streams): kind,
                      name, static cycles (a Repeat's count times its body),
                      children; at most MAX_TREE_NODES nodes
    static_estimate   the compiler's cycles for one run (Program.cycles: counted
                      loops times their count) and the loops whose trip count
                      is unknown at compile time, with cycles per iteration
    exchange_bytes    bytes moved between tiles in the last run
    time_breakdown    the last run's cycles by kind of work: compute, exchange,
                      sync, ipu_link (collectives), gw_link (collectives between IPU-Link domains), streaming_memory, host
    between_processes with jax.distributed, what this process exchanged with the
                      others for the launch the run was part of (shared by its
                      IPUs in this process): exchanges, bytes_sent,
                      bytes_received, seconds (the transport's wall time: the
                      simulation's cost; on a POD these collectives run over
                      IPU-Links and GW-Links, charged in time_breakdown); zeros
                      for a run that exchanged nothing with other processes
    host_transfers    the program's argument and result streams: bytes, cycles
    cycles            device (the last run's steps), host (streams), total
    estimated_seconds device = cycles / clock, host_transfers = bytes / host link,
                      total
    cost_analysis, memory_stats   what JAX's compiled.cost_analysis() and
                      memory_analysis() report for the program
"""
from __future__ import annotations

import collections
import json
import types
import weakref

import numpy as np

from jax_ipu.graph import programs as p
from jax_ipu.graph.compute import vertex_codelets
from jax_ipu.profile.breakdown import no_exchanges, time_breakdown

FORMAT = "jax-ipu-profile/1"
MAX_STEPS = 10_000     # long loops: the first steps, and the count of the rest
MAX_OVER_TILES = 32    # tiles over the memory limit listed with the tensors on them
MAX_LIVE_TENSORS = 50  # tensors listed as live at the liveness peak
MAX_TREE_NODES = 5_000


def _per_tile(tensors, num_tiles: int) -> np.ndarray:
    total = np.zeros(num_tiles, dtype=np.int64)
    for t in tensors:
        total += t.mapping.elements_per_tile(num_tiles) * t.dtype.itemsize
    return total


def _tensor(t, nbytes: int | None = None) -> dict:
    d = {"name": t.name, "dtype": t.dtype.name, "shape": list(t.shape), "bytes": int(t.nbytes)}
    if nbytes is not None:
        d["bytes_on_tile"] = int(nbytes)
    return d


def memory(program) -> dict:
    m = program.memory
    tiles = program.num_tiles
    arguments = _per_tile(program.inputs, tiles)
    constants = _per_tile([t for t in program.tensors if t.constant is not None], tiles)
    inputs = {t.id for t in program.inputs}
    peak = m.peak
    tile = m.max_tile
    over = np.flatnonzero(peak > m.bytes_per_tile)
    listed = [int(x) for x in over[np.argsort(-peak[over], kind="stable")][:MAX_OVER_TILES]]
    watched = {tile: [], **{x: [] for x in listed}}
    # One pass over the tensors: the largest one on every tile (the page's
    # hover) and all those on the busiest tile and the tiles over the limit.
    largest_bytes = np.zeros(tiles, dtype=np.int64)
    largest = np.full(tiles, -1, dtype=np.int64)
    for t in program.tensors:
        if t.streaming:        # in streaming memory: no tile holds it
            continue
        on = t.mapping.elements_per_tile(tiles) * t.dtype.itemsize
        bigger = on > largest_bytes
        largest_bytes[bigger], largest[bigger] = on[bigger], t.id
        for x, found in watched.items():
            if on[x]:
                found.append((int(on[x]), t))

    def on_tile(x: int) -> list[dict]:
        return [{**_tensor(t, n), "always_live": t.constant is not None or t.id in inputs}
                for n, t in sorted(watched[x], key=lambda f: -f[0])[:5]]

    names = sorted({int(i) for i in largest if i >= 0})
    index = {t: k for k, t in enumerate(names)}
    return {
        "bytes_per_tile": m.bytes_per_tile, "fits": bool(m.fits), "max_tile": tile, "max_bytes": m.max_bytes,
        "total_bytes": m.total_bytes, "always_live_bytes": int(m.always_live.sum()),
        "not_always_live_peak_bytes": int(m.not_always_live_peak.sum()),
        "tiles_over_limit": int(len(over)),
        "largest_tensors_on_max_tile": on_tile(tile),
        "over_limit": [{"tile": x, "peak": int(peak[x]), "over": int(peak[x] - m.bytes_per_tile),
                        "always_live": int(m.always_live[x]),
                        "not_always_live_peak": int(m.not_always_live_peak[x]), "tensors": on_tile(x)}
                       for x in listed],
        "per_tile": {
            "always_live": m.always_live.tolist(), "arguments": arguments.tolist(),
            "constants": constants.tolist(), "code": m.code.tolist(),
            "not_always_live_peak": m.not_always_live_peak.tolist(), "peak": peak.tolist(),
            "largest_tensor": [index.get(int(i), -1) for i in largest], "largest_tensor_bytes": largest_bytes.tolist(),
        },
        "largest_tensor_names": [program.tensors[i].name for i in names],
        "liveness": liveness(program),
    }


def _name(step) -> str:
    if isinstance(step, p.Execute):
        return step.compute_set.name
    if isinstance(step, p.Copy):
        return step.dst.name
    if isinstance(step, (p.Repeat, p.RepeatWhileTrue, p.Call)):
        return step.name or type(step).__name__
    if isinstance(step, p.If):
        return step.predicate.name
    if isinstance(step, p.Switch):
        return step.control.name
    if isinstance(step, p.HostCall):
        return f"host callback {step.callback_id}"
    if isinstance(step, p.StreamingCopy):
        return step.name
    if isinstance(step, p.HostToDevice):
        return f"argument {step.index}"
    if isinstance(step, p.DeviceToHost):
        return f"result {step.index}"
    return type(step).__name__


def liveness(program) -> dict:
    """Not-always-live bytes at each top-level step of the program (a loop
    is one step), the peak, and the tensors live there."""
    m = program.memory
    body = program.body.steps
    top = body[len(program.inputs):len(body) - len(program.outputs)]
    n = len(m.liveness)
    if len(top) != n:          # not the compiler's schedule: label by index
        top = [None] * n
    at = int(np.argmax(m.liveness)) if n else -1
    tensors = [program.tensors[i] for i in m.live_at_peak]
    return {
        "steps": [{"kind": type(s).__name__, "name": _name(s)} if s is not None else {"kind": "", "name": str(i)}
                  for i, s in enumerate(top)],
        "not_always_live": m.liveness.tolist(), "exchange_buffers": m.liveness_exchange.tolist(),
        "on_max_tile": m.liveness_on_max_tile.tolist(),
        "peak_step": at, "peak_bytes": int(m.liveness[at]) if n else 0,
        "tensors_at_peak": [_tensor(t) for t in tensors[:MAX_LIVE_TENSORS]],
        "tensors_at_peak_not_listed": max(len(tensors) - MAX_LIVE_TENSORS, 0),
    }


def _source(name: str) -> str:
    """A tensor's producing op and source line (`multiply@file.py:92:20
    (jit(step)/...)` -> `multiply@file.py:92`)."""
    op = name.split(" (")[0]
    if "@" in op and op.count(":") >= 2:
        op = op.rsplit(":", 1)[0]
    return op


def memory_breakdown(program, busiest: bool = True) -> dict:
    """Where a program's memory goes at its peak: with `busiest`, on the
    busiest tile at the step where it peaks; else summed over all tiles at
    the step where their sum peaks. `parts` adds up to `total` (the
    busiest tile's bytes, or the sum over tiles at that step):
    arguments (each input's bytes, `arguments_by_index`, with the outputs
    written into their donated input's memory), constants, code, vertex
    state, exchange buffers, and the live tensors, each under its
    producing op and source line in `tensors` ({source: [bytes, count,
    example name]}, largest first) and under `kinds`: the pass that made
    it by its name (JAX's name stack: `transpose(` marks the backward pass,
    and JAX's recomputation of a checkpointed function in it names
    `rematted_computation`), else `forward pass`."""
    m = program.memory
    tiles = program.num_tiles
    if busiest:
        tile = m.max_tile
        step, ids, sizes = m.max_tile_step, m.live_on_max_tile, m.live_on_max_tile_bytes
        exchange = int(m.exchange_on_max_tile[step]) if step >= 0 else 0

        def on(values):
            return int(values[tile])
        live = int(m.liveness_on_max_tile[step]) if step >= 0 else 0
    else:
        tile = None
        step, ids, sizes = m.peak_step, m.live_at_peak, m.live_at_peak_bytes
        exchange = int(m.liveness_exchange[step]) if step >= 0 else 0

        def on(values):
            return int(np.sum(values))
        live = int(m.liveness[step]) if step >= 0 else 0
    arguments = [on(t.mapping.elements_per_tile(tiles) * t.dtype.itemsize) if not t.streaming else 0
                 for t in program.inputs]
    constants = on(_per_tile([t for t in program.tensors if t.constant is not None], tiles))
    vertex_state = on(m.vertex_state) if len(m.vertex_state) else 0
    code = on(m.code) - vertex_state
    tensors: dict = {}
    kinds = collections.Counter()
    for i, nbytes in zip(ids, sizes, strict=True):
        t = program.tensors[i]
        source = _source(t.name)
        row = tensors.setdefault(source, [0, 0, t.name])
        row[0] += nbytes
        row[1] += 1
        stack = t.name.split(" (", 1)[-1] if " (" in t.name else ""
        kinds["backward pass: recomputed forward" if "rematted_computation" in stack else
              "backward pass" if "transpose(" in stack else "forward pass"] += nbytes
    parts = {"arguments": sum(arguments), "constants": constants, "code": code, "vertex state": vertex_state,
             "exchange buffers": exchange, "tensors": sum(sizes)}
    body = program.body.steps
    top = body[len(program.inputs):len(body) - len(program.outputs)]
    return {
        "tile": tile, "step": step, "steps": len(m.liveness),
        "step_name": _name(top[step]) if 0 <= step < len(top) and len(top) == len(m.liveness) else str(step),
        "total": sum(parts.values()), "live": live, "parts": parts, "arguments_by_index": arguments,
        "held_by_inputs": len(m.held_by_inputs), "kinds": dict(kinds.most_common()),
        "tensors": dict(sorted(tensors.items(), key=lambda kv: -kv[1][0])),
    }


def program_tree(program) -> dict:
    """The program tree (Sequence, Repeat, If... down to Execute and Copy)
    with each node's static cycles: a Repeat counts its body times its
    count, an If or Switch its longest branch, a RepeatWhileTrue one test
    of its condition (and cycles_per_iteration). Past MAX_TREE_NODES
    nodes, a node says how many steps are not listed."""
    budget = [MAX_TREE_NODES]

    def sequence(label: str, seq) -> dict:
        kids, cycles = nodes(seq.steps)
        return {"kind": "Sequence", "name": label, "cycles": cycles, "children": kids}

    def nodes(steps) -> tuple[list, int]:
        out, total = [], 0
        for i, step in enumerate(steps):
            if budget[0] <= 0:
                out.append({"kind": "More", "name": f"{len(steps) - i} more steps not listed", "cycles": 0})
                total += _cycles(steps[i:])
                break
            node = tree(step)
            out.append(node)
            total += node["cycles"]
        return out, total

    def tree(step) -> dict:
        budget[0] -= 1
        node = {"kind": type(step).__name__, "name": _name(step)}
        if isinstance(step, p.Sequence):
            node["children"], node["cycles"] = nodes(step.steps)
        elif isinstance(step, p.Repeat):
            body = sequence("body", step.body)
            node.update(count=step.count, cycles=step.count * (body["cycles"] + step.cycles),
                        children=body["children"], **_control(step, body["cycles"]))
        elif isinstance(step, p.RepeatWhileTrue):
            condition, body = sequence("condition", step.condition), sequence("body", step.body)
            node.update(cycles=condition["cycles"] + step.cycles, children=[condition, body],
                        **_control(step, condition["cycles"] + body["cycles"]))
        elif isinstance(step, p.If):
            branches = [sequence("then", step.then_body), sequence("else", step.else_body)]
            node.update(cycles=step.cycles + max(b["cycles"] for b in branches), children=branches,
                        **_control(step))
        elif isinstance(step, p.Switch):
            branches = [sequence(f"case {k}", c) for k, c in step.cases.items()]
            branches.append(sequence("default", step.default))
            node.update(cycles=step.cycles + max(b["cycles"] for b in branches), children=branches,
                        **_control(step))
        elif isinstance(step, p.Call):
            node["children"], node["cycles"] = nodes(step.function.steps)
        else:
            if isinstance(step, (p.HostToDevice, p.DeviceToHost)):     # host link time, not the IPU's
                node.update(cycles=0, host_cycles=int(step.cycles))
            else:
                node["cycles"] = int(getattr(step, "cycles", 0))
            if isinstance(step, (p.Execute, p.Copy)):
                node["exchange_bytes"] = int(step.exchange_bytes)
        return node

    return tree(program.body)


def _control(step, iteration: int | None = None) -> dict:
    """A control step's own cost per decision (an iteration, a branch
    taken: compiler.cost.cost_control) and, for a loop, what one iteration
    costs: its steps' cycles, syncs and exchanges, and the control."""
    found = {"control": {"cycles": int(step.cycles), "exchange_cycles": int(step.exchange_cycles),
                         "sync_cycles": int(step.sync_cycles), "exchange_bytes": int(step.exchange_bytes)}}
    if iteration is None:
        return found
    parts = [step.body] if isinstance(step, p.Repeat) else [step.condition, step.body]
    leaves = [s for part in parts for s in p.leaves(part)]
    found["cycles_per_iteration"] = int(iteration + step.cycles)
    found["per_iteration"] = {
        "syncs": sum(1 for s in leaves if getattr(s, "sync_cycles", 0)) + bool(step.sync_cycles),
        "sync_cycles": sum(int(getattr(s, "sync_cycles", 0)) for s in leaves) + int(step.sync_cycles),
        "exchange_cycles": sum(int(getattr(s, "exchange_cycles", 0)) for s in leaves) + int(step.exchange_cycles),
        "exchange_bytes": sum(int(getattr(s, "exchange_bytes", 0)) for s in leaves) + int(step.exchange_bytes),
        "control_cycles": int(step.cycles)}
    return found


def _cycles(steps) -> int:
    """Static cycles of steps left out of the tree (as program_tree counts)."""
    total = 0
    for step in steps:
        if isinstance(step, p.Sequence):
            total += _cycles(step.steps)
        elif isinstance(step, p.Repeat):
            total += step.count * (_cycles(step.body.steps) + step.cycles)
        elif isinstance(step, p.RepeatWhileTrue):
            total += _cycles(step.condition.steps) + step.cycles
        elif isinstance(step, (p.If, p.Switch)):
            total += step.cycles + max(_cycles(b.steps) for b in p.children(step))
        elif isinstance(step, p.Call):
            total += _cycles(step.function.steps)
        elif not isinstance(step, (p.HostToDevice, p.DeviceToHost)):
            total += int(getattr(step, "cycles", 0))
    return total


def compute_sets(program) -> list[dict]:
    out = []
    for step in p.leaves(program.body):
        if isinstance(step, p.Execute):
            cs = step.compute_set
            codelets = collections.Counter(vertex_codelets(cs.vertices))
            out.append({"name": cs.name, "vertices": len(cs.vertices), "tiles": len(cs.tiles()),
                        "codelets": dict(codelets), "cycles": step.cycles, "exchange_bytes": step.exchange_bytes})
    return out


def host_transfers(program, target) -> dict:
    streams = [s for s in p.leaves(program.body) if isinstance(s, (p.HostToDevice, p.DeviceToHost))]
    to_device = [{"argument": s.index, "bytes": s.tensor.nbytes, "cycles": s.cycles}
                 for s in streams if isinstance(s, p.HostToDevice)]
    to_host = [{"result": s.index, "bytes": s.src.size * s.src.dtype.itemsize, "cycles": s.cycles}
               for s in streams if isinstance(s, p.DeviceToHost)]
    nbytes = sum(s["bytes"] for s in to_device + to_host)
    return {"host_to_device": to_device, "device_to_host": to_host, "bytes": nbytes,
            "cycles": program.host_cycles, "seconds": nbytes / target.host_link_bytes_per_second}


def _phases(program) -> dict:
    """(kind, name, cycles, exchange bytes) -> (exchange, sync) cycles of the
    program's steps: a run records only the first four, and steps may share
    a name (a function traced twice at one source line)."""
    found = {}
    for step in p.leaves(program.body):
        if isinstance(step, (p.Execute, p.Copy)):
            name = step.compute_set.name if isinstance(step, p.Execute) else step.dst.name
            found.setdefault((type(step).__name__, name, int(step.cycles), int(step.exchange_bytes)),
                             (step.exchange_cycles, step.sync_cycles))
    for step in _controls(program.body):
        found.setdefault((type(step).__name__, p.decision_name(step), int(step.cycles), int(step.exchange_bytes)),
                         (step.exchange_cycles, step.sync_cycles))
    return found


def _controls(step):
    """The loops and branches of a program tree (their decisions' costs)."""
    if isinstance(step, (p.Repeat, p.RepeatWhileTrue, p.If, p.Switch)):
        yield step
    if isinstance(step, p.CONTROL):
        for child in p.children(step):
            yield from _controls(child)


def _step(kind: str, name: str, cycles: int, nbytes: int, phases: dict) -> dict:
    step = {"kind": kind, "name": name, "cycles": int(cycles), "exchange_bytes": int(nbytes)}
    found = phases.get((kind, name, int(cycles), int(nbytes)))
    if found is not None and found[0] + found[1] <= cycles:
        step["exchange_cycles"], step["sync_cycles"] = int(found[0]), int(found[1])
    return step


# A program's parts of its report that no run changes (memory plan, compute
# sets, step phases): built once, as they took 10 ms of an MLP step's
# report, and last_profile is read after every step in training loops.
_STATIC: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _static(program) -> tuple[dict, list, dict, dict]:
    parts = _STATIC.get(program)
    if parts is None:
        tree = program_tree(program)
        tree["name"] = program.name
        parts = _STATIC[program] = (memory(program), compute_sets(program), _phases(program), tree)
    return parts


def _copy(x):
    """A copy of JSON-like data the caller may change without changing the
    cached one (flat lists of numbers copied at once)."""
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy(v) for v in x] if x and isinstance(x[0], (dict, list)) else list(x)
    return x


def build(program, run, device, between: dict | None = None) -> dict:
    """The report of `program`'s run (a model.engine.RunRecord) on a pjrt
    Device (or anything with .id and .target); `between`: the exchanges
    with other processes of the launch the run was part of."""
    target = device.target
    memory_part, compute_part, phases, tree = _static(program)
    steps = [_step(kind, name, cycles, nbytes, phases) for kind, name, cycles, nbytes in run.steps[:MAX_STEPS]]
    host = host_transfers(program, target)
    cycles = int(run.cycles)
    device_seconds = cycles / target.clock_hz
    return {
        "format": FORMAT,
        "program": program.name,
        "device": int(device.id),
        "compiled": True,
        "target": {"name": target.name, "num_tiles": target.num_tiles, "bytes_per_tile": target.bytes_per_tile,
                   "clock_hz": target.clock_hz, "host_link_bytes_per_second": target.host_link_bytes_per_second,
                   "description": target.describe()},
        "memory": _copy(memory_part),
        "compute_sets": [{**c, "codelets": dict(c["codelets"])} for c in compute_part],
        "steps": steps,
        "steps_not_listed": max(len(run.steps) - MAX_STEPS, 0),
        "program_tree": _copy(tree),
        "exchange_bytes": int(run.exchange_bytes),
        "time_breakdown": time_breakdown(run.steps, phases),
        "between_processes": dict(between) if between else no_exchanges(),
        "host_transfers": host,
        "cycles": {"device": cycles, "host": int(program.host_cycles), "total": cycles + int(program.host_cycles)},
        "estimated_seconds": {"device": device_seconds, "host_transfers": host["seconds"],
                              "total": device_seconds + host["seconds"]},
        "static_estimate": static_estimate(program),
        "cost_analysis": program.cost_analysis(),
        "memory_stats": program.memory_stats(),
        # The ops on types the IPU emulates (bfloat16, complex64), with
        # their cycles in the compile-time estimate.
        "emulated": [dict(e) for e in program.emulated],
    }


def static_estimate(program) -> dict:
    return {"cycles": int(program.cycles),
            "unknown_trip_loops": [dict(loop) for loop in program.unknown_trip_loops],
            "cycles_per_unknown_iteration": int(program.cycles_per_unknown_iteration)}


def build_failed(program, target, message: str) -> dict:
    """The report of a program that did not compile for lack of memory:
    its memory plan, compute sets and static estimate; no run."""
    no_run = types.SimpleNamespace(steps=[], cycles=0, exchange_bytes=0)
    report = build(program, no_run, types.SimpleNamespace(id=0, target=target))
    report.update(device=None, compiled=False, error=message)
    cycles = report["static_estimate"]["cycles"]
    report["cycles"].update(device=cycles, total=cycles + report["cycles"]["host"])
    seconds = report["estimated_seconds"]
    seconds.update(device=cycles / target.clock_hz, total=cycles / target.clock_hz + seconds["host_transfers"])
    return report


def write_json(report: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
