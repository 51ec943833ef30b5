"""An IPU device of the client: its description, its worker and engine."""
from __future__ import annotations

import queue
import threading
import time
import weakref

from jax_ipu.model.engine import Engine, forget_quiet_thread, quiet_numpy_on_this_thread
from jax_ipu.pjrt._capi import JobQueue, drain_released
from jax_ipu.targets import STREAMING_MEMORY_KIND, Target


class TransferCounters:
    """Bytes over the host link, both ways (the donation tests read them)."""

    __slots__ = ("host_to_device", "device_to_host")

    def __init__(self):
        self.host_to_device = 0
        self.device_to_host = 0

    def as_dict(self) -> dict[str, int]:
        return {"host_to_device_bytes": self.host_to_device,
                "device_to_host_bytes": self.device_to_host}


class DeviceWorker(JobQueue):
    """Runs a device's jobs in submission order, one at a time, so that an
    Execute call returns before its program has finished (asynchronous
    dispatch, as on the hardware's stream).

    Most jobs wake the worker thread at once. A *quick* job (a run of a
    program that is known to take less than QUICK_SECONDS and cannot block)
    is deferred instead: the worker picks it up after GRACE_SECONDS, unless
    a thread that needs the device first runs it itself (help()): the next
    Execute on the device, a copy to the host, or anyone asking for a
    buffer's ready event (wanted()). Waking a thread and handing it the GIL
    costs more than such a program takes to run, so dispatch of small
    programs would otherwise be paid in thread switches.

    For the same reason the worker does not wake for every quick job while
    others take them (a thread dispatching small programs back to back, or
    waiting for each): having found its job taken, it sleeps up to
    LINGER_SECONDS at a time, and a quick job submitted meanwhile does not
    wake it. A job nobody asks about then runs at most LINGER_SECONDS after
    its grace; once a whole linger passes without a job, the worker sleeps
    until woken."""

    GRACE_SECONDS = 0.0005
    LINGER_SECONDS = 0.008

    def __init__(self, name: str):
        # (the queue, the run lock and the counts are JobQueue's)
        self._wake: queue.SimpleQueue = queue.SimpleQueue()
        self._wakes_at = 0.0
        self.closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self.thread_ident = self._thread.ident     # (compared on every dispatch)

    def on_worker_thread(self) -> bool:
        return threading.get_ident() == self.thread_ident

    def close(self) -> None:
        self.closed = True
        self._wake.put(False)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self.closed

    def _loop(self) -> None:
        quiet_numpy_on_this_thread()
        try:
            self._serve()
        finally:
            forget_quiet_thread()
            self.thread_ident = None      # (its ident may be reused by another thread)

    def _serve(self) -> None:
        jobs, wake, run_lock = self._jobs, self._wake, self._run_lock
        waited = None          # the quick job the last sleep was for
        counted = 0            # jobs submitted when the worker last looked at an empty queue
        while True:
            timeout = None
            # Set before looking: a job submitted after the look that is due
            # earlier wakes us.
            self._wakes_at = float("inf")
            now = time.perf_counter()
            if jobs:
                quick, due, seq = jobs[0][1:]     # (not the job: a sleeping worker would keep it)
                if quick and seq > self._urged:
                    # Its grace; a linger if others took the job slept for.
                    wake_at = max(due, now + self.LINGER_SECONDS) if waited not in (None, seq) else due
                    timeout, waited = wake_at - now, seq
                    self._wakes_at = wake_at
                if timeout is None or timeout <= 0:
                    self._wakes_at = 0.0
                    waited = None
                    with run_lock:
                        # The job looked at, unless another thread ran it
                        # meanwhile (then the next one has its own grace).
                        if jobs and jobs[0][3] == seq:
                            jobs.popleft()[0]()   # jobs report their own errors through events
                    drain_released()
                    continue
            elif self._submitted != counted:
                # Jobs came and others took them: linger while they dispatch.
                counted, waited = self._submitted, None
                timeout = self.LINGER_SECONDS
                self._wakes_at = now + timeout
            try:
                if not wake.get(timeout=timeout):
                    return                 # closed
            except queue.Empty:
                pass


class Device:
    memory_kind = "device"
    # The PJRT memories of each IPU, in order (a buffer's `memory` indexes
    # them): its tile SRAM, the default, and its streaming memory.
    memories = (("device", "tile SRAM"), (STREAMING_MEMORY_KIND, "streaming memory (off-chip DRAM)"))

    def __init__(self, id: int, target: Target, local_hardware_id: int | None = None, process_index: int = 0,
                 process_count: int = 1):
        _describe(self, id, target, id if local_hardware_id is None else local_hardware_id, process_index,
                  process_count)
        self.transfers = TransferCounters()
        self.engine = Engine(target)
        self.worker = DeviceWorker(f"ipu{id}")
        self.last_program = None   # for jax_ipu.last_profile, with engine.last_run
        self.last_between_processes = None   # and its launch's exchanges with other processes
        self.streaming = weakref.WeakSet()    # live buffers in streaming memory
        self.streaming_limit = target.streaming_bytes

    def streaming_bytes_in_use(self) -> int:
        """Counted once the runs queued before have finished: a run holds its
        inputs until its job ends, after its results are ready."""
        if self.worker.running and not self.worker.on_worker_thread():
            done = threading.Event()
            self.worker.submit(done.set)
            done.wait(timeout=600)
        drain_released()
        return sum(b.nbytes for b in list(self.streaming) if b.holds_data)


def _describe(device, id: int, target: Target, local_hardware_id: int, process_index: int,
              process_count: int) -> None:
    """What PJRT tells of an IPU, local or another process's."""
    device.id = id
    device.local_hardware_id = local_hardware_id
    device.process_index = process_index
    device.target = target
    device.kind = f"IPU Model {target.name} ({target.num_tiles} tiles)"
    where = f"process {process_index}, " if process_count > 1 else ""
    device.to_string = f"IpuDevice(id={id}, {where}IPU Model {target.name}, {target.num_tiles} tiles)"
    device.debug_string = f"{device.to_string}: {target.describe()}"
    device.attributes = {"target": target.name, "num_tiles": target.num_tiles,
                         "bytes_per_tile": target.bytes_per_tile}
    device.bytes_limit = target.num_tiles * target.bytes_per_tile


class RemoteDevice:
    """An IPU of another process (jax.distributed): listed, named in device
    assignments, never run or transferred to here."""
    memories = Device.memories

    def __init__(self, id: int, target: Target, local_hardware_id: int, process_index: int, process_count: int):
        _describe(self, id, target, local_hardware_id, process_index, process_count)
