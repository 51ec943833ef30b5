"""Profiles of executed programs (Poplar's autoReport, for the IPU Model).

Switched on by `JAX_IPU_PROFILE=DIR`, by Poplar's
`POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true","autoReport.directory":"DIR"}'`,
or from Python:

    with jax_ipu.profiling("report"):       # or jax_ipu.profile.start("report") ... stop()
        f(x).block_until_ready()

Profiles are aggregated per compiled program and device: one JSON file per
program, `DIR/<program>-<n>.json` (n counts the programs of the session),
with its run count, the cycles of its runs, and the steps of its last run
(see report.py for the contents), and beside it `<program>-<n>.trace.json`,
the last run on a timeline (Chrome / Perfetto trace events, trace.py). A
program that does not fit in memory gets a report too, of its memory plan
(no run, no timeline). The files are written by stop(), at the end of a
`with` block, and at interpreter exit for profiles switched on by the
environment. `jax-ipu report FILE` prints a summary. With html=True (or
`jax-ipu report --html OUT DIR`, or write_html), each report also gets a
page to open in a browser, `<program>-<n>.html` (html.py; needs plotly).

Nothing here is imported by the execution path but ACTIVE: a run checks
that one attribute, and records only when profiling is on.
"""
from __future__ import annotations

import contextlib
import threading

from jax_ipu.profile.breakdown import BETWEEN_PROCESSES, no_exchanges

ACTIVE = None      # the running Session, or None

# fn() -> the IPU devices whose queued runs a session waits for; the PJRT
# client installs it (set_devices) when it starts (profiles never import the client).
_all_devices = None


class Session:
    """The programs run while profiling is on, and where their reports go."""

    def __init__(self, directory: str | None, html: bool = False):
        self.directory = directory
        self.html = html
        self.entries: dict = {}    # (id(program), device id) -> [program, device, runs, cycles, min, max, last]
        self.failed: list = []     # (program, target, message) of compilations out of memory
        self._lock = threading.Lock()

    def record(self, program, device, run, between: dict | None = None) -> None:
        """Called on the device's worker after each successful run; `between`:
        its launch's exchanges with other processes (None: none)."""
        try:
            cycles = run.cycles
            with self._lock:
                entry = self.entries.get((id(program), device.id))
                if entry is None:
                    entry = self.entries[id(program), device.id] = [program, device, 0, 0, cycles, cycles, run,
                                                                    None, no_exchanges()]
                entry[2] += 1
                entry[3] += cycles
                entry[4] = min(entry[4], cycles)
                entry[5] = max(entry[5], cycles)
                entry[6] = run
                entry[7] = dict(between) if between else None
                for key in BETWEEN_PROCESSES if between else ():
                    entry[8][key] += between[key]
        except Exception:   # a profile must never break a run
            pass

    def record_failure(self, program, target, message: str) -> None:
        with self._lock:
            if not any(p.name == program.name and m == message for p, _, m in self.failed):
                self.failed.append((program, target, message))

    def reports(self) -> list[dict]:
        from jax_ipu.profile.report import build, build_failed
        with self._lock:
            entries = [list(e) for e in self.entries.values()]
            failed = list(self.failed)
        out = [build_failed(program, target, message) for program, target, message in failed]
        for program, device, runs, total, low, high, run, between, between_total in entries:
            report = build(program, run, device, between)
            report["runs"] = {"count": runs, "total_cycles": total, "min_cycles": low, "max_cycles": high,
                              "total_estimated_seconds": runs * report["estimated_seconds"]["host_transfers"]
                              + total / device.target.clock_hz, "between_processes": between_total}
            out.append(report)
        return out

    def write(self, reports: list[dict] | None = None) -> list[str]:
        """Writes one JSON report per program and, for those that ran, its
        timeline (.trace.json), and with html=True its page (.html);
        returns the reports' paths."""
        if not self.directory:
            return []
        import os

        from jax_ipu.profile.report import write_json
        from jax_ipu.profile.trace import write_trace
        os.makedirs(self.directory, exist_ok=True)
        paths = []
        for n, report in enumerate(self.reports() if reports is None else reports):
            name = "".join(c if c.isalnum() or c in "_." else "_" for c in report["program"])
            suffix = "" if report["device"] in (0, None) else f"-ipu{report['device']}"
            path = os.path.join(self.directory, f"{name}-{n}{suffix}.json")
            if report["compiled"]:
                trace = path[:-len(".json")] + ".trace.json"
                write_trace(report, trace)
                report["trace_file"] = os.path.basename(trace)
            write_json(report, path)
            if self.html:
                write_html(report, path[:-len(".json")] + ".html")
            paths.append(path)
        return paths


def start(directory: str | None = None, write_at_exit: bool = False, html: bool = False) -> Session:
    """Starts recording every run (replacing a running session). With a
    directory, stop() writes the reports there as JSON (and with html=True
    a page of each beside it)."""
    global ACTIVE
    if html:
        from jax_ipu.profile.html import _plotly
        _plotly()          # say now, not at the end of a long run, that plotly is missing
    session = Session(directory, html)
    if write_at_exit:
        import atexit
        atexit.register(_write_at_exit, session)
    ACTIVE = session
    return session


def stop() -> list[dict]:
    """Stops recording, writes the session's files, returns its reports."""
    global ACTIVE
    if ACTIVE is None:
        return []
    _wait_for_devices()      # runs dispatched before stop() are the session's, finished or not
    session, ACTIVE = ACTIVE, None
    reports = session.reports()
    session.write(reports)
    return reports


def _write_at_exit(session: Session) -> None:
    if ACTIVE is session:
        try:
            stop()
        except Exception as exc:   # at exit, say so instead of a traceback
            import sys
            print(f"jax-ipu: could not write the profile to {session.directory}: {exc}", file=sys.stderr)


@contextlib.contextmanager
def profiling(directory: str | None = None, html: bool = False):
    """Profiles the runs in the block; yields the Session. At the end, the
    reports are written to `directory` (when given; with html=True, a page
    of each beside it) and kept in session.results."""
    session = start(directory, html=html)
    session.results = []
    try:
        yield session
    finally:
        if ACTIVE is session:
            session.results = stop()


def set_devices(all_devices) -> None:
    """all_devices() -> the devices a session waits for at its end."""
    global _all_devices
    _all_devices = all_devices


def _wait_for_devices(devices=None) -> None:
    """Waits for the runs already queued on the devices' workers."""
    if devices is None:
        if _all_devices is None:
            return
        devices = _all_devices()
    events = []
    for device in devices:
        if not device.worker.running or device.worker.on_worker_thread():
            continue      # (stopped from a host callback: its own run is under way)
        done = threading.Event()
        device.worker.submit(done.set)
        events.append(done)
    for done in events:
        done.wait(timeout=600)


def out_of_memory(error, target) -> None:
    """Called when a compilation runs out of memory: with profiling on,
    the session's files include a report of the program that does not fit."""
    session = ACTIVE
    if session is not None and getattr(error, "program", None) is not None:
        session.record_failure(error.program, target, str(error))


def write_html(report, path: str) -> str:
    """Writes the page of a report (a dict from profiling / last_profile,
    or a report's JSON file) to `path`, one self-contained HTML file that
    opens offline in a browser; returns the path. Needs plotly
    (pip install 'jax-ipu[report]')."""
    from jax_ipu.profile.html import write_html as write
    return write(report, path)


def last(device) -> dict | None:
    """The report of the last program run on a pjrt Device, or None."""
    _wait_for_devices([device])
    program, run = device.last_program, device.engine.last_run
    if program is None or run is None:
        return None
    from jax_ipu.profile.report import build
    return build(program, run, device, getattr(device, "last_between_processes", None))
