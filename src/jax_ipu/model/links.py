"""The IPU-Links between the Model's devices: the replicas of one launch of
a program meet here at each collective.

A Launch is shared by the runs of one execution (one per device). At a
collective every replica posts its contribution, waits for the others
(a barrier with a timeout), reads all contributions and waits again before
the next collective may overwrite them. A replica that fails aborts the
launch, so the others raise instead of waiting forever.

With several processes (jax.distributed) a launch has replicas here and in
other processes: the `remote` side (given by the PJRT layer) fills in the
other processes' contributions once this process's replicas have posted,
in one exchange per collective, so that every replica then reads all of
them as in one process."""
from __future__ import annotations

import threading
from typing import NamedTuple

from jax_ipu.errors import IpuError, IpuReplicaFailed, IpuRuntimeError
from jax_ipu.model.fast import helper

# Seconds a replica waits for the others at one collective: the replicas
# run the same program, so a long wait means one is stuck or diverged.
RENDEZVOUS_TIMEOUT_SECONDS = 600.0


class Launch:
    """`size` replicas in all; this process runs `local_ranks` (all of them
    without `remote`). `remote` has exchange(slots, step) filling the other
    processes' slots, crosses(groups), failed(reason) (a replica here
    failed) and finish()."""

    def __init__(self, size: int, timeout: float = RENDEZVOUS_TIMEOUT_SECONDS, local_ranks=None, remote=None):
        self.size = size
        self.remote = remote
        parties = size if local_ranks is None else len(local_ranks)
        self._barrier = threading.Barrier(parties, timeout=timeout)
        self._posted = threading.Barrier(parties, action=self._across, timeout=timeout) if remote else self._barrier
        self._slots: list = [None] * size
        self._step = 0                  # collectives so far (that went across processes)
        self._crossing = False
        self._ended = 0
        self._parties = parties
        self._end_lock = threading.Lock()
        self.failure: str | None = None

    def exchange(self, rank: int, value, use, crossing: bool = True):
        """use(every replica's `value`, by rank): called while the values are
        still posted, so that no replica changes its own before all are done.
        `crossing`: whether other processes' values are needed (the same in
        every replica)."""
        self._slots[rank] = value
        self._crossing = crossing
        self._wait(rank, self._posted)
        result = use(self._slots)
        self._wait(rank, self._barrier)
        return result

    def crosses(self, groups) -> bool:
        """Whether a collective over `groups` (() for all) needs other processes."""
        return self.remote is not None and self.remote.crosses(groups)

    def _across(self) -> None:
        # Run by the last replica to post, while the others wait.
        if self.remote is not None and self._crossing:
            try:
                self.remote.exchange(self._slots, self._step)
            except BaseException as exc:
                self.failure = str(exc)
                raise
            self._step += 1

    def abort(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        self._barrier.abort()
        self._posted.abort()
        if self.remote is not None:      # the other processes may wait for this one
            self.remote.failed(reason)

    def end(self) -> None:
        """A replica's run is over (well or not)."""
        with self._end_lock:
            self._ended += 1
            last = self._ended == self._parties
        if last and self.remote is not None:
            self.remote.finish()

    def _wait(self, rank: int, barrier) -> None:
        helper.end_session()      # the other replicas may need the helper's core
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            # Another replica failed (its reason is the launch's), or one is late.
            kind = IpuReplicaFailed if self.failure is not None else IpuRuntimeError
            why = self.failure or (f"a replica did not reach the collective within "
                                   f"{barrier._timeout:.0f} s (replicas took different paths?)")
            self.failure = why
            raise kind(f"replica {rank}: collective abandoned: {why}") from None
        except IpuError:       # the exchange across processes, in the replica that ran it
            self._barrier.abort()
            raise


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
        launch = self.replica.launch
        if launch is not None:
            if exc is not None:
                launch.abort(f"replica {self.replica.rank} failed: {exc}")
            launch.end()
        return False
