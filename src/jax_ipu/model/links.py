"""The IPU-Links between the Model's devices: the replicas of one launch of
a program meet here at each collective.

A Launch is shared by the runs of one execution (one per device). At a
collective every replica posts its contribution, waits for the others
(a barrier with a timeout), reads all contributions and waits again before
the next collective may overwrite them. A replica that fails aborts the
launch, so the others raise instead of waiting forever."""
from __future__ import annotations

import threading
from typing import NamedTuple

from jax_ipu.errors import IpuRuntimeError
from jax_ipu.model.fast import helper

# Seconds a replica waits for the others at one collective: the replicas
# run the same program, so a long wait means one is stuck or diverged.
RENDEZVOUS_TIMEOUT_SECONDS = 600.0


class Launch:
    def __init__(self, size: int, timeout: float = RENDEZVOUS_TIMEOUT_SECONDS):
        self.size = size
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._slots: list = [None] * size
        self.failure: str | None = None

    def exchange(self, rank: int, value, use):
        """use(every replica's `value`, by rank): called while the values are
        still posted, so that no replica changes its own before all are done."""
        self._slots[rank] = value
        self._wait(rank)
        result = use(self._slots)
        self._wait(rank)
        return result

    def abort(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        self._barrier.abort()

    def _wait(self, rank: int) -> None:
        helper.end_session()      # the other replicas may need the helper's core
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            why = self.failure or (f"a replica did not reach the collective within "
                                   f"{self._barrier._timeout:.0f} s (replicas took different paths?)")
            self.failure = why
            raise IpuRuntimeError(f"replica {rank}: collective abandoned: {why}") from None


class Replica(NamedTuple):
    """Who a run is within its launch: rank = replica * partitions + partition."""
    launch: Launch | None
    rank: int
    replica: int
    partition: int


_SINGLE = Replica(None, 0, 0, 0)
_current = threading.local()


def current() -> Replica:
    """The replica the calling device worker is running."""
    return getattr(_current, "replica", _SINGLE)


def running(replica: Replica | None):
    """Context for one run on this thread."""
    return _Running(replica or _SINGLE)


class _Running:
    def __init__(self, replica: Replica):
        self.replica = replica

    def __enter__(self):
        _current.replica = self.replica
        return self.replica

    def __exit__(self, kind, exc, tb):
        _current.replica = _SINGLE
        if exc is not None and self.replica.launch is not None:
            self.replica.launch.abort(f"replica {self.replica.rank} failed: {exc}")
        return False
