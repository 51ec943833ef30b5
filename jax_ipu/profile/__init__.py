"""Profiles of executed programs (Poplar's autoReport, for the IPU Model).

Switched on by `JAX_IPU_PROFILE=DIR`, by Poplar's
`POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true","autoReport.directory":"DIR"}'`,
or from Python:

    with jax_ipu.profiling("report"):       # or jax_ipu.profile.start("report") ... stop()
        f(x).block_until_ready()

Profiles are aggregated per compiled program and device: one JSON file per
program, `DIR/<program>-<n>.json` (n counts the programs of the session),
with its run count, the cycles of its runs, and the steps of its last run
(see report.py for the contents). The files are written by stop(), at the
end of a `with` block, and at interpreter exit for profiles switched on by
the environment. `jax-ipu report FILE` prints a summary.

Nothing here is imported by the execution path but ACTIVE: a run checks
that one attribute, and records only when profiling is on.
"""
from __future__ import annotations

import contextlib
import threading

ACTIVE = None      # the running Session, or None


class Session:
    """The programs run while profiling is on, and where their reports go."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self.entries: dict = {}    # (id(program), device id) -> [program, device, runs, cycles, min, max, last]
        self._lock = threading.Lock()

    def record(self, program, device, run) -> None:
        """Called on the device's worker after each successful run."""
        try:
            cycles = run.cycles
            with self._lock:
                entry = self.entries.get((id(program), device.id))
                if entry is None:
                    self.entries[id(program), device.id] = [program, device, 1, cycles, cycles, cycles, run]
                else:
                    entry[2] += 1
                    entry[3] += cycles
                    entry[4] = min(entry[4], cycles)
                    entry[5] = max(entry[5], cycles)
                    entry[6] = run
        except Exception:   # a profile must never break a run
            pass

    def reports(self) -> list[dict]:
        from jax_ipu.profile.report import build
        with self._lock:
            entries = [list(e) for e in self.entries.values()]
        out = []
        for program, device, runs, total, low, high, run in entries:
            report = build(program, run, device)
            report["runs"] = {"count": runs, "total_cycles": total, "min_cycles": low, "max_cycles": high,
                              "total_estimated_seconds": runs * report["estimated_seconds"]["host_transfers"]
                              + total / device.target.clock_hz}
            out.append(report)
        return out

    def write(self) -> list[str]:
        """Writes one JSON file per program; returns their paths."""
        if not self.directory:
            return []
        from jax_ipu.profile.report import write_json
        import os
        os.makedirs(self.directory, exist_ok=True)
        paths = []
        for n, report in enumerate(self.reports()):
            name = "".join(c if c.isalnum() or c in "_." else "_" for c in report["program"])
            suffix = "" if report["device"] == 0 else f"-ipu{report['device']}"
            path = os.path.join(self.directory, f"{name}-{n}{suffix}.json")
            write_json(report, path)
            paths.append(path)
        return paths


def start(directory: str | None = None, write_at_exit: bool = False) -> Session:
    """Starts recording every run (replacing a running session). With a
    directory, stop() writes the reports there as JSON."""
    global ACTIVE
    session = Session(directory)
    if write_at_exit:
        import atexit
        atexit.register(_write_at_exit, session)
    ACTIVE = session
    return session


def stop() -> list[dict]:
    """Stops recording, writes the session's files, returns its reports."""
    global ACTIVE
    session, ACTIVE = ACTIVE, None
    if session is None:
        return []
    _wait_for_devices()
    session.write()
    return session.reports()


def _write_at_exit(session: Session) -> None:
    if ACTIVE is session:
        try:
            stop()
        except Exception as exc:   # at exit, say so instead of a traceback
            import sys
            print(f"jax-ipu: could not write the profile to {session.directory}: {exc}", file=sys.stderr)


@contextlib.contextmanager
def profiling(directory: str | None = None):
    """Profiles the runs in the block; yields the Session. At the end, the
    reports are written to `directory` (when given) and kept in
    session.results."""
    session = start(directory)
    session.results = []
    try:
        yield session
    finally:
        if ACTIVE is session:
            session.results = stop()


def _wait_for_devices(devices=None) -> None:
    """Waits for the runs already queued on the devices' workers."""
    from jax_ipu.pjrt import client
    if client.CURRENT is None:
        return
    events = []
    for device in devices or client.CURRENT.devices:
        if not device.worker.running:
            continue
        done = threading.Event()
        device.worker.submit(done.set)
        events.append(done)
    for done in events:
        done.wait(timeout=600)


def last(device) -> dict | None:
    """The report of the last program run on a pjrt Device, or None."""
    _wait_for_devices([device])
    program, run = device.last_program, device.engine.last_run
    if program is None or run is None:
        return None
    from jax_ipu.profile.report import build
    return build(program, run, device)
