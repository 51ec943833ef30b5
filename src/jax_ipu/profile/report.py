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
                      not_always_live_peak and peak; the largest tensors on the
                      busiest tile
    compute_sets      per compute set in the program: vertices, tiles, codelets,
                      estimated cycles and exchanged bytes
    steps             the last run's executed steps in order (Execute or Copy):
                      name, cycles (with their exchange and sync parts),
                      exchanged bytes; loops appear once per iteration
    static_estimate   the compiler's cycles for one run (Program.cycles: counted
                      loops times their count) and the loops whose trip count
                      is unknown at compile time, with cycles per iteration
    exchange_bytes    bytes moved between tiles in the last run
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

from jax_ipu.graph.compute import vertex_codelets
from jax_ipu.graph.programs import Copy, DeviceToHost, Execute, HostToDevice, leaves

FORMAT = "jax-ipu-profile/1"
MAX_STEPS = 10_000     # long loops: the first steps, and the count of the rest


def _per_tile(tensors, num_tiles: int) -> np.ndarray:
    total = np.zeros(num_tiles, dtype=np.int64)
    for t in tensors:
        total += t.mapping.elements_per_tile(num_tiles) * t.dtype.itemsize
    return total


def memory(program) -> dict:
    m = program.memory
    tiles = program.num_tiles
    arguments = _per_tile(program.inputs, tiles)
    constants = _per_tile([t for t in program.tensors if t.constant is not None], tiles)
    tile = m.max_tile
    on_tile = sorted(((int(t.mapping.elements_per_tile(tiles)[tile]) * t.dtype.itemsize, t)
                      for t in program.tensors), key=lambda x: -x[0])
    return {
        "bytes_per_tile": m.bytes_per_tile, "fits": bool(m.fits), "max_tile": tile, "max_bytes": m.max_bytes,
        "total_bytes": m.total_bytes, "always_live_bytes": int(m.always_live.sum()),
        "not_always_live_peak_bytes": int(m.not_always_live_peak.sum()),
        "tiles_over_limit": int((m.peak > m.bytes_per_tile).sum()),
        "largest_tensors_on_max_tile": [
            {"name": t.name, "dtype": t.dtype.name, "shape": list(t.shape), "bytes_on_tile": n,
             "always_live": t.constant is not None or t in program.inputs}
            for n, t in on_tile[:5] if n],
        "per_tile": {
            "always_live": m.always_live.tolist(), "arguments": arguments.tolist(),
            "constants": constants.tolist(), "code": m.code.tolist(),
            "not_always_live_peak": m.not_always_live_peak.tolist(), "peak": m.peak.tolist(),
        },
    }


def compute_sets(program) -> list[dict]:
    out = []
    for step in leaves(program.body):
        if isinstance(step, Execute):
            cs = step.compute_set
            codelets = collections.Counter(vertex_codelets(cs.vertices))
            out.append({"name": cs.name, "vertices": len(cs.vertices), "tiles": len(cs.tiles()),
                        "codelets": dict(codelets), "cycles": step.cycles, "exchange_bytes": step.exchange_bytes})
    return out


def host_transfers(program, target) -> dict:
    streams = [s for s in leaves(program.body) if isinstance(s, (HostToDevice, DeviceToHost))]
    to_device = [{"argument": s.index, "bytes": s.tensor.nbytes, "cycles": s.cycles}
                 for s in streams if isinstance(s, HostToDevice)]
    to_host = [{"result": s.index, "bytes": s.src.size * s.src.dtype.itemsize, "cycles": s.cycles}
               for s in streams if isinstance(s, DeviceToHost)]
    nbytes = sum(s["bytes"] for s in to_device + to_host)
    return {"host_to_device": to_device, "device_to_host": to_host, "bytes": nbytes,
            "cycles": program.host_cycles, "seconds": nbytes / target.host_link_bytes_per_second}


def _phases(program) -> dict:
    """(kind, name) -> (exchange, sync) cycles of the program's steps."""
    found = {}
    for step in leaves(program.body):
        if isinstance(step, (Execute, Copy)):
            name = step.compute_set.name if isinstance(step, Execute) else step.dst.name
            found.setdefault((type(step).__name__, name), (step.exchange_cycles, step.sync_cycles))
    return found


def _step(kind: str, name: str, cycles: int, nbytes: int, phases: dict) -> dict:
    step = {"kind": kind, "name": name, "cycles": int(cycles), "exchange_bytes": int(nbytes)}
    exchange, sync = phases.get((kind, name), (0, 0))
    if exchange + sync <= cycles:
        step["exchange_cycles"], step["sync_cycles"] = int(exchange), int(sync)
    return step


# A program's parts of its report that no run changes (memory plan, compute
# sets, step phases): built once, as they took 10 ms of an MLP step's
# report, and last_profile is read after every step in training loops.
_STATIC: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _static(program) -> tuple[dict, list, dict]:
    parts = _STATIC.get(program)
    if parts is None:
        parts = _STATIC[program] = (memory(program), compute_sets(program), _phases(program))
    return parts


def _copy_memory(m: dict) -> dict:
    """A copy the caller may change without changing the cached one."""
    return {**m, "largest_tensors_on_max_tile": [{**t, "shape": list(t["shape"])}
                                                 for t in m["largest_tensors_on_max_tile"]],
            "per_tile": {k: list(v) for k, v in m["per_tile"].items()}}


def build(program, run, device) -> dict:
    """The report of `program`'s run (a model.engine.RunRecord) on a pjrt
    Device (or anything with .id and .target)."""
    target = device.target
    memory_part, compute_part, phases = _static(program)
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
        "memory": _copy_memory(memory_part),
        "compute_sets": [{**c, "codelets": dict(c["codelets"])} for c in compute_part],
        "steps": steps,
        "steps_not_listed": max(len(run.steps) - MAX_STEPS, 0),
        "exchange_bytes": int(run.exchange_bytes),
        "host_transfers": host,
        "cycles": {"device": cycles, "host": int(program.host_cycles), "total": cycles + int(program.host_cycles)},
        "estimated_seconds": {"device": device_seconds, "host_transfers": host["seconds"],
                              "total": device_seconds + host["seconds"]},
        "static_estimate": static_estimate(program),
        "cost_analysis": program.cost_analysis(),
        "memory_stats": program.memory_stats(),
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
