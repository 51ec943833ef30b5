"""The IPU client: devices, compilation, host transfers."""
from __future__ import annotations

import numpy as np

from jax_ipu import config as config_lib
from jax_ipu import profile
from jax_ipu.errors import (
    IpuError,
    IpuInternalCompilerError,
    IpuInvalidArgument,
    IpuOutOfMemoryError,
    IpuResourceExhausted,
)
from jax_ipu.pjrt import compile_options
from jax_ipu.pjrt.buffer import ArraySpec, DeviceBuffer, check_ipu_dtype, to_device
from jax_ipu.pjrt.cache import ExecutableCache
from jax_ipu.pjrt.device import Device, RemoteDevice
from jax_ipu.pjrt.executable import Executable, device_assignment_ids, fingerprint
from jax_ipu.pjrt.shardings import inspect_sharding
from jax_ipu.targets import get_target
from jax_ipu.version import __version__

# The live client, for jax_ipu's public helpers (transfer counters, profiles).
CURRENT = None


class Client:
    platform_name = "ipu"

    def __init__(self, config: config_lib.Config, process_index: int = 0, process_count: int = 1, store=None):
        self.config = config
        self.target = get_target(config.target, num_tiles=config.num_tiles)
        self.platform_version = f"jax-ipu {__version__}, {self.target.describe()}"
        self.process_index = process_index
        self.processes = None     # distributed.Processes, with jax.distributed
        count = config.device_count
        if process_count > 1:
            from jax_ipu.pjrt import distributed
            if store is None:
                raise IpuInvalidArgument(
                    f"this is process {process_index} of {process_count} but JAX passed no key-value store to "
                    "the ipu plugin: start the processes with jax.distributed.initialize(...)")
            distributed.exchange_topology(store, process_index, process_count,
                                          distributed.describe_local(config, self.target))
            self.processes = distributed.Processes(store, process_index, process_count, count,
                                                   config.collective_timeout)
        # Every process's IPUs, ids numbered process by process; this
        # process's are `devices` (the ones it runs), the others' only named.
        first = process_index * count
        self.devices = [Device(first + i, self.target, i, process_index, process_count) for i in range(count)]
        self.all_devices = [self.devices[d - first] if d // count == process_index
                            else RemoteDevice(d, self.target, d % count, d // count, process_count)
                            for d in range(count * process_count)]
        self._local = {d.id: d for d in self.devices}
        # Run 64-bit types as 32-bit ones (JAX_IPU_F64_AS_F32, jax_ipu.set_f64_as_f32).
        self.f64_as_f32 = config.f64_as_f32
        self.keepalive: list = []  # what the C structs point at
        # Poplar's executable cache (JAX_IPU_EXECUTABLE_CACHE, --executable_cache_path).
        self.cache = ExecutableCache(config.executable_cache) if config.executable_cache else None

    def device(self, device_id: int) -> Device:
        """One of this process's IPUs."""
        device = self._local.get(device_id)
        if device is None:
            self.any_device(device_id)
            raise IpuInvalidArgument(
                f"IPU {device_id} belongs to process {self.all_devices[device_id].process_index}, not to this "
                f"process ({self.process_index}), whose IPUs are {self.devices[0].id}-{self.devices[-1].id}")
        return device

    def local_device(self, device_id: int) -> Device | None:
        """This process's IPU of that id, or None."""
        return self._local.get(device_id)

    def any_device(self, device_id: int):
        """An IPU of any process."""
        if not 0 <= device_id < len(self.all_devices):
            raise IpuInvalidArgument(f"no IPU device {device_id}: {len(self.all_devices)} configured "
                                     f"(JAX_IPU_DEVICE_COUNT per process)")
        return self.all_devices[device_id]

    def update_process_info(self, infos: list) -> None:
        """What the framework learnt of the processes (task id, state, error)."""
        if self.processes is not None:
            self.processes.update(infos)

    def compile(self, code: bytes, fmt: str, options: bytes) -> Executable:
        from jaxlib._jax import CompileOptions

        if fmt != "mlir":
            raise IpuInvalidArgument(f"jax-ipu compiles StableHLO ('mlir') programs, not {fmt!r}")
        parsed = CompileOptions.ParseFromString(options)
        overrides = dict(parsed.env_option_overrides)
        # Checked before the cache: a bad option is refused, and an ignored one warned of, on every compile.
        requested = compile_options.parse(overrides)
        assignment, serialized = _assignment(parsed)
        for row in assignment:
            for device_id in row:
                self.any_device(device_id)
        key = None
        if self.cache is not None:
            # Before the compiler is imported: a hit never needs it.
            settings = (sorted(overrides.items()), self.config.allow_out_of_memory, self.f64_as_f32,
                        self.config.emulate_types,
                        self.config.ipus_per_link_domain)
            key = self.cache.key(fmt.encode() + b"\0" + code, settings, assignment, self.target)
            executable = self.cache.load(self, key)
            if executable is not None:
                return executable
        from jax_ipu.compiler import CompileOptions as IpuCompileOptions
        from jax_ipu.compiler import compile_module
        from jax_ipu.stablehlo import import_module, module_text

        defaults = dict(allow_out_of_memory=self.config.allow_out_of_memory,
                        f64_policy="as_f32" if self.f64_as_f32 else "error", dump_to=self.config.dump_to,
                        emulate_types=self.config.emulate_types,
                        link_domains=_link_domains(assignment, self.config.ipus_per_link_domain),
                        inspect_sharding=inspect_sharding)
        module = import_module(code)
        try:
            program = compile_module(module, self.target, IpuCompileOptions(**{**defaults, **requested.changes}))
        except IpuOutOfMemoryError as exc:
            profile.out_of_memory(exc, self.target)   # with profiling on, a report of what does not fit
            raise
        except IpuError:
            raise
        except Exception as exc:  # a compiler bug outside the op rules
            raise IpuInternalCompilerError(
                f"internal error compiling {module.name}: {type(exc).__name__}: {exc}. This is a jax-ipu "
                f"bug: please report it with this message") from exc
        if not program.memory.fits:
            import warnings
            warnings.warn(f"{program.name} does not fit in {self.target.describe()} ({program.memory.describe()}); "
                          "compiled anyway, as allow_out_of_memory asks (JAX_IPU_ALLOW_OUT_OF_MEMORY, "
                          "debug.allowOutOfMemory or the compiler option): see its profile", stacklevel=2)
        name = module.main.name if module.entry == "main" else module.entry
        policy = (b"f64_as_f32" if self.f64_as_f32 else b"") + (b"" if self.config.emulate_types else b"native")
        executable = Executable(self, program, name, fingerprint(code + policy, options, self.target),
                                assignment, serialized,
                                stablehlo=module_text(code) if requested.embed_ir else None)
        # What processes compare before they exchange: the program itself
        # (the compile options hold process-specific fields).
        executable.program_hash = fingerprint(code + policy, b"", self.target).decode()
        if key is not None:
            self.cache.store(key, executable)
        return executable

    def deserialize(self, data: bytes, options: bytes | None) -> Executable:
        """An executable saved by Executable.serialize (PJRT_Executable_DeserializeAndLoad)."""
        from jax_ipu.pjrt.executable import from_bytes
        return from_bytes(self, data, options)

    def buffer_from_host(self, array: np.ndarray, device_id: int, memory: int = 0,
                         bytes_in_use: int = 0, layout: tuple[int, ...] | None = None) -> DeviceBuffer:
        """`layout`: the order of dimensions (major first) the device holds
        the array in (JAX's device_layout), None for row-major."""
        check_ipu_dtype(array.dtype, self.f64_as_f32, self.config.emulate_types)
        device = self.device(device_id)
        if layout is not None and sorted(layout) != list(range(array.ndim)):
            raise IpuInvalidArgument(f"layout {tuple(layout)} does not order the {array.ndim} dimensions of "
                                     f"a {array.dtype}{list(array.shape)} array")
        spec = ArraySpec.of(array.dtype, array.shape, layout)
        if memory == 0 and not self.config.allow_out_of_memory:   # (Poplar's debug.allowOutOfMemory)
            _check_room(device, spec, bytes_in_use, "device_put")
        data = to_device(array if spec.layout is None else array.transpose(spec.layout), spec)
        device.transfers.host_to_device += data.nbytes
        return DeviceBuffer(device, spec, data, memory=memory)

    def copy_buffer(self, buffer: DeviceBuffer, device_id: int, memory: int = 0,
                    bytes_in_use: int = 0) -> DeviceBuffer:
        device = self.device(device_id)
        if memory == 0 and not self.config.allow_out_of_memory:   # (streaming memory is not tile SRAM)
            _check_room(device, buffer.spec, bytes_in_use, f"a copy from IPU {buffer.device.id}")
        return buffer.copy_to_device(device, memory)

    def close(self) -> None:
        for device in self.devices:
            device.worker.close()


def _check_room(device: Device, spec: ArraySpec, bytes_in_use: int, what: str) -> None:
    """Refuses an array the device's memory cannot hold beside the buffers
    it holds now (`bytes_in_use`, counted at the PJRT boundary), as a
    device's allocator fails a transfer that does not fit, instead of
    accepting it and failing the next compile."""
    free = device.bytes_limit - bytes_in_use
    if spec.nbytes > free:
        raise IpuResourceExhausted(
            f"{what} of {spec.dtype}{list(spec.shape)} ({spec.nbytes:,} bytes) does not fit in IPU {device.id}'s "
            f"memory: {bytes_in_use:,} of {device.bytes_limit:,} bytes are in use ({free:,} free). Delete arrays "
            f"you no longer need, shard the array over several IPUs, or use a larger target")


def _cancel_runs_on_interrupt() -> None:
    """Ctrl-C stops the runs on the devices too, at their next loop
    iteration, instead of letting a long loop hold its IPU: Python's SIGINT
    handler (when it is the default one, on the main thread) is chained
    with one that first cancels them, then raises KeyboardInterrupt as
    before. A handler the user installed is left alone."""
    import signal
    import threading

    from jax_ipu.model.engine import cancel_runs

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def on_interrupt(signum, frame):
        cancel_runs()
        signal.default_int_handler(signum, frame)
    signal.signal(signal.SIGINT, on_interrupt)


def create_client(options: dict, store=None) -> Client:
    """The client of PJRT_Client_Create: `options` are its create options
    (with jax.distributed, JAX adds node_id and num_nodes), `store` the
    key-value store JAX passes, or None."""
    global CURRENT
    options = dict(options)
    process_index = int(options.pop("node_id", 0))
    process_count = int(options.pop("num_nodes", 1))
    options.pop("partition_index", None)
    CURRENT = Client(config_lib.from_environment(overrides=options), process_index, process_count, store)
    client = CURRENT
    profile.set_devices(lambda: client.devices)
    _cancel_runs_on_interrupt()
    if CURRENT.config.profile_directory:
        profile.start(CURRENT.config.profile_directory, write_at_exit=True)
    return CURRENT


def _assignment(parsed) -> tuple[list[list[int]], bytes]:
    """(device ids [replica][partition], serialized DeviceAssignmentProto)
    of parsed CompileOptions: the one JAX gave, else devices 0, 1, ..."""
    proto = parsed.executable_build_options.device_assignment
    if proto is not None:
        serialized = proto.serialize()
        return device_assignment_ids(serialized), serialized
    from jaxlib._jax import DeviceAssignment
    n_r, n_p = max(parsed.num_replicas, 1), max(parsed.num_partitions, 1)
    ids = np.arange(n_r * n_p, dtype=np.int32).reshape(n_r, n_p)
    return ids.tolist(), DeviceAssignment.create(ids).serialize()


def _link_domains(assignment: list[list[int]], ipus_per_domain: int) -> tuple:
    """The IPU-Link domain of each rank's IPU (rank = replica x partitions
    + partition); () when they are all in one."""
    domains = tuple(device_id // ipus_per_domain for row in assignment for device_id in row)
    return domains if len(set(domains)) > 1 else ()
