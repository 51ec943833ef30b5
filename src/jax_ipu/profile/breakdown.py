"""Where a run's time goes: its executed steps summed by kind of work
(compute, on-chip exchange, sync, IPU-Link collectives, collectives over
GW-Links between IPU-Link domains, streaming memory transfers, host
transfers and callbacks), in cycles of the modelled IPU; and what its
launch exchanged with other processes."""
from __future__ import annotations

from jax_ipu.graph.codelets_collectives import COLLECTIVES

# Compute sets whose cycles are mostly link transfers (the collectives'
# lowering names them after their kernel).
_LINK_PREFIXES = tuple(kind.__name__ for kind in COLLECTIVES)
_STREAMING_PREFIX = "StreamingMemory"
_GW_LINK_MARK = " (over GW-Links)"      # compiler.lowering.collectives.OVER_GW_LINKS
# Steps whose cycles are the device's own: compute sets, copies, and the
# decisions of control steps (a loop's iteration, a branch taken).
_DEVICE_KINDS = ("Execute", "Copy", "Repeat", "RepeatWhileTrue", "If", "Switch")
# What a run's report counts of its launch's exchanges with other processes
# (jax.distributed), as pjrt.distributed counts them.
BETWEEN_PROCESSES = ("exchanges", "bytes_sent", "bytes_received", "seconds")


def no_exchanges() -> dict:
    """Exchanges between processes, the bytes this process sent and
    received in them, and the seconds they took (the transport's wall
    time): none yet."""
    return {**dict.fromkeys(BETWEEN_PROCESSES, 0), "seconds": 0.0}


def time_breakdown(steps, phases: dict) -> dict[str, int]:
    """steps: (kind, name, cycles, exchange bytes) per executed step (a
    model.engine.RunRecord's); phases: (kind, name, cycles, bytes) -> (exchange,
    sync)
    cycles of the program's steps (profile.report._phases)."""
    out = dict.fromkeys(("compute", "exchange", "sync", "ipu_link", "gw_link", "streaming_memory", "host"), 0)
    for kind, name, cycles, nbytes in steps:
        if kind == "Execute" and name.startswith(_LINK_PREFIXES):
            out["gw_link" if name.endswith(_GW_LINK_MARK) else "ipu_link"] += cycles
        elif name.startswith(_STREAMING_PREFIX):
            out["streaming_memory"] += cycles
        elif kind not in _DEVICE_KINDS:
            out["host"] += cycles
        else:
            exchange, sync = phases.get((kind, name, int(cycles), int(nbytes)), (0, 0))
            if exchange + sync > cycles:
                exchange = sync = 0
            out["exchange"] += exchange
            out["sync"] += sync
            out["compute"] += cycles - exchange - sync
    return {k: int(v) for k, v in out.items()}
