"""jax-ipu: run JAX on Graphcore IPUs (the IPU Model by default).

Install it and JAX finds the `ipu` platform by itself:

    import jax
    ipu = jax.devices("ipu")[0]
    y = jax.jit(f)(jax.device_put(x, ipu))

This module holds the small public API; nothing heavy is imported here.
"""
from jax_ipu import profile  # noqa: F401  (light: start/stop/profiling)
from jax_ipu.errors import (  # noqa: F401
    IpuCompileError,
    IpuError,
    IpuInvalidArgument,
    IpuOutOfMemoryError,
    IpuRuntimeError,
    IpuUnimplementedError,
)
from jax_ipu.profile import profiling  # noqa: F401
from jax_ipu.version import __version__  # noqa: F401


def _client():
    from jax_ipu.pjrt import client
    if client.CURRENT is None:
        import jax
        jax.devices("ipu")  # creates the client
    return client.CURRENT


def target(device=None):
    """The modelled IPU behind a jax device (the first IPU when None): its
    figures (tiles, SRAM per tile, clock, ...) as a jax_ipu.targets.Target."""
    client = _client()
    return client.device(0 if device is None else device.id).target


def estimated_seconds(cycles: float, device=None) -> float:
    """IPU time of `cycles` on the device's modelled IPU."""
    return cycles / target(device).clock_hz


def transfer_stats(device=None) -> dict[str, int]:
    """Bytes moved over the host link to and from an IPU device (all IPUs
    summed when `device` is None). Donated state that stays on the device
    never appears here; what went between processes (jax.distributed) is
    transfers_between_processes()."""
    devices = _client().devices if device is None else [_client().device(device.id)]
    total = {"host_to_device_bytes": 0, "device_to_host_bytes": 0}
    for d in devices:
        for key, value in d.transfers.as_dict().items():
            total[key] += value
    return total


def transfers_between_processes() -> dict:
    """With jax.distributed: what this process has exchanged with the other
    processes for collectives spanning them, since it started: exchanges,
    bytes_sent, bytes_received, seconds (the transport's wall time, the
    simulation's cost: on a POD these collectives run on the IPUs over
    IPU-Links and GW-Links, which estimates charge). Zeros in one process.
    Each run's share is its profile's `between_processes`."""
    processes = _client().processes
    return profile.no_exchanges() if processes is None else dict(processes.stats)


def streaming_memory_in_use(device=None) -> int:
    """Bytes of the arrays held in an IPU's streaming memory (JAX memory
    kind "pinned_host"; the first IPU when `device` is None). They are not
    in device.memory_stats(), which describes tile SRAM."""
    return _client().device(0 if device is None else device.id).streaming_bytes_in_use()


def set_f64_as_f32(enabled: bool = True) -> bool:
    """Runs 64-bit types as 32-bit ones on the IPU (float64 as float32,
    int64/uint64 as int32/uint32), as JAX_IPU_F64_AS_F32=1 does; returns
    the previous setting. It applies to programs compiled and arrays placed
    afterwards (JAX keeps the programs it compiled: set it before the first
    call of a jitted function)."""
    client = _client()
    previous, client.f64_as_f32 = client.f64_as_f32, bool(enabled)
    return previous


def last_profile(device=None) -> dict | None:
    """The profile report (a dict, as written to JSON) of the last program
    run on an IPU device (the first when None), whether or not profiling is
    on; None before any run. Waits for the runs already queued."""
    return profile.last(_client().device(0 if device is None else device.id))


_LAZY = {"InfeedQueue": "jax_ipu.feeds", "OutfeedQueue": "jax_ipu.feeds", "infeed": "jax_ipu.feeds",
         "outfeed": "jax_ipu.feeds", "FeedError": "jax_ipu.feeds", "FeedTimeout": "jax_ipu.feeds"}


def __getattr__(name: str):
    # Feeds import jax; jax imports this package while it discovers plugins.
    if name == "pipeline":      # jax_ipu.pipeline: plain JAX, imports jax
        import importlib
        return importlib.import_module("jax_ipu.pipeline")
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jax_ipu' has no attribute {name!r}")
