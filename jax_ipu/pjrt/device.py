"""An IPU device of the client: its description, its worker and engine."""
from __future__ import annotations

import queue
import threading

from jax_ipu.model.engine import Engine, quiet_numpy_on_this_thread
from jax_ipu.pjrt._capi import drain_released
from jax_ipu.model.targets import Target


class TransferCounters:
    """Bytes over the host link, both ways (the donation tests read them)."""

    __slots__ = ("host_to_device", "device_to_host")

    def __init__(self):
        self.host_to_device = 0
        self.device_to_host = 0

    def as_dict(self) -> dict[str, int]:
        return {"host_to_device_bytes": self.host_to_device,
                "device_to_host_bytes": self.device_to_host}


class DeviceWorker:
    """Runs a device's jobs in submission order on one thread, so that an
    Execute call returns before its program has finished (asynchronous
    dispatch, as on the hardware's stream)."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        self.closed = True
        self._jobs.put(None)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not getattr(self, "closed", False)

    def _loop(self) -> None:
        quiet_numpy_on_this_thread()
        while (job := self._jobs.get()) is not None:
            job()  # jobs report their own errors through events
            drain_released()


class Device:
    memory_kind = "device"

    def __init__(self, id: int, target: Target):
        self.id = id
        self.local_hardware_id = id
        self.target = target
        self.kind = f"IPU Model {target.name} ({target.num_tiles} tiles)"
        self.to_string = f"IpuDevice(id={id}, IPU Model {target.name}, {target.num_tiles} tiles)"
        self.debug_string = f"{self.to_string}: {target.describe()}"
        self.attributes = {"target": target.name, "num_tiles": target.num_tiles,
                           "bytes_per_tile": target.bytes_per_tile}
        self.bytes_limit = target.num_tiles * target.bytes_per_tile
        self.transfers = TransferCounters()
        self.engine = Engine(target)
        self.worker = DeviceWorker(f"ipu{id}")
        self.last_program = None   # for jax_ipu.last_profile, with engine.last_run
