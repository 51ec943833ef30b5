"""A profile report's last run on a timeline, as Chrome trace events (the
JSON that https://ui.perfetto.dev and chrome://tracing open).

One process per IPU (pid = device id). Its "program steps" track holds the
executed steps one after another in estimated time (cycles / clock), each
Execute or Copy with its exchange, compute and sync phases nested inside;
its "host link" track holds the argument streams before and the result
streams after. Every event's args give its cycles and bytes."""
from __future__ import annotations

import json

FORMAT = "jax-ipu-trace/1"
HOST, STEPS = 0, 1                 # thread ids of the two tracks


def trace_events(report: dict) -> dict:
    """The trace (a dict with "traceEvents") of a report with a run."""
    clock = report["target"]["clock_hz"]
    pid = report["device"] or 0

    def us(cycles: float) -> float:
        return cycles / clock * 1e6

    def event(name: str, category: str, tid: int, start: int, cycles: int, **args) -> dict:
        return {"name": name, "cat": category, "ph": "X", "pid": pid, "tid": tid, "ts": us(start),
                "dur": us(cycles), "args": {"cycles": int(cycles), **args}}

    events = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {
            "name": f"IPU {pid}: {report['program']} on {report['target']['description']}"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": HOST, "args": {"name": "host link"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": STEPS, "args": {"name": "program steps"}},
    ]
    host = report["host_transfers"]
    now = 0
    for stream in host["host_to_device"]:
        events.append(event(f"argument {stream['argument']} to IPU", "host transfer", HOST, now, stream["cycles"],
                            bytes=stream["bytes"]))
        now += stream["cycles"]
    for step in report["steps"]:
        cycles = step["cycles"]
        events.append(event(step["name"], step["kind"], STEPS, now, cycles, kind=step["kind"],
                            exchange_bytes=step["exchange_bytes"]))
        if "exchange_cycles" in step:
            exchange, sync = step["exchange_cycles"], step["sync_cycles"]
            at = now
            for phase, length in (("exchange", exchange), ("compute", cycles - exchange - sync), ("sync", sync)):
                if length > 0:
                    events.append(event(phase, phase, STEPS, at, length))
                    at += length
        now += cycles
    if report.get("steps_not_listed"):
        events.append({"name": f"{report['steps_not_listed']} more steps not listed", "ph": "i", "s": "t",
                       "pid": pid, "tid": STEPS, "ts": us(now)})
    for stream in host["device_to_host"]:
        events.append(event(f"result {stream['result']} to host", "host transfer", HOST, now, stream["cycles"],
                            bytes=stream["bytes"]))
        now += stream["cycles"]
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"format": FORMAT, "program": report["program"], "device": report["device"],
                          "clock_hz": clock, "device_cycles": report["cycles"]["device"],
                          "host_cycles": report["cycles"]["host"]}}


def write_trace(report: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(trace_events(report), f)
        f.write("\n")
