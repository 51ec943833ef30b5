"""jax.profiler's tracer for the IPUs (behind the PJRT profiler extension).

Inside `jax.profiler.trace(dir)` (or start_trace ... stop_trace) jaxlib
creates a Tracer, starts it, stops it and collects an XSpace from it
(xspace.py), which it writes with its own host events to
`dir/plugins/profile/<run>/<host>.xplane.pb`. While a Tracer runs, every
program run on an IPU is kept: the program, the device, the engine's
RunRecord (its executed steps, what the profile reports read) and the host
time it began. The XSpace is built only when collected.

Outside a trace, a run reads RUNNING (an empty tuple) once and records
nothing.
"""
from __future__ import annotations

import dataclasses
import socket
import threading
import time

from jax_ipu.utils import protowire

RUNNING: tuple = ()          # the running Tracers
_lock = threading.Lock()
# Steps one trace keeps at most: a long training loop can run millions
# (a loop's run keeps a list of its steps), each built with its phases.
MAX_STEPS = 500_000


@dataclasses.dataclass
class PartRun:
    """A run whose steps beyond a trace's MAX_STEPS are not kept: their
    number and cycles are (their time still passes on the timeline)."""
    steps: list
    cycles: int
    unlisted_steps: int
    unlisted_cycles: int


def device_tracer_level(options: bytes) -> int:
    """tensorflow.ProfileOptions.device_tracer_level (field 3, a varint) of
    serialized options; 0 turns device tracing off, as for JAX's GPUs."""
    for number, wire, value in protowire.fields(options, "profiler options"):
        if number == 3 and wire == 0:
            return value
    return 0


class Tracer:
    """One profiler of jaxlib's: created, started, stopped, collected."""

    def __init__(self, options: bytes = b""):
        self.enabled = device_tracer_level(options) > 0 if options else True
        self.runs: list = []          # (program, device, RunRecord or PartRun, start ns, number)
        self.kept = 0                 # steps kept
        self.start_ns = 0
        self._runs_lock = threading.Lock()

    def start(self) -> None:
        global RUNNING
        if not self.enabled:
            return
        self.runs, self.kept = [], 0
        self.start_ns = time.time_ns()
        with _lock:
            if self not in RUNNING:
                RUNNING = RUNNING + (self,)

    def stop(self) -> None:
        """Runs dispatched before the trace stops are the trace's: waits for
        those queued on the IPUs, then stops recording."""
        global RUNNING
        if self not in RUNNING:
            return
        from jax_ipu.profile import _wait_for_devices
        _wait_for_devices()
        with _lock:
            RUNNING = tuple(t for t in RUNNING if t is not self)

    def record(self, program, device, run, start_ns: int) -> None:
        """Called on the device's worker after each successful run."""
        with self._runs_lock:
            room = MAX_STEPS - self.kept
            if len(run.steps) > room:
                rest = run.steps[max(room, 0):]
                run = PartRun(run.steps[:max(room, 0)], run.cycles, len(rest), sum(s[2] for s in rest))
            self.kept += len(run.steps)
            self.runs.append((program, device, run, start_ns, len(self.runs)))

    def collect(self) -> bytes:
        """The serialized XSpace of the runs recorded (empty without any)."""
        self.stop()
        with self._runs_lock:
            runs, self.runs, self.kept = self.runs, [], 0
        if not runs:
            return b""
        from jax_ipu.profile import xspace
        runs.sort(key=lambda r: (r[1].id, r[3], r[4]))
        space = xspace.build(runs, self.start_ns, hostname=socket.gethostname())
        return space.SerializeToString()


def record(program, device, run, start_ns: int) -> None:
    """Gives a finished run to the running Tracers."""
    for tracer in RUNNING:
        tracer.record(program, device, run, start_ns)
