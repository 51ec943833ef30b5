"""A compiled IPU program, loaded on its devices, and its execution."""
from __future__ import annotations

import hashlib
import re
import threading
import time
import uuid
from threading import get_ident

import numpy as np

from jax_ipu import profile
from jax_ipu.errors import IpuInvalidArgument, IpuReplicaFailed, IpuRuntimeError
from jax_ipu.graph import programs as p
from jax_ipu.model import links
from jax_ipu.pjrt._capi import Event, set_run_hooks
from jax_ipu.pjrt.buffer import ArraySpec, DeviceBuffer
from jax_ipu.pjrt.device import Device
from jax_ipu.pjrt.shardings import executable_shardings
from jax_ipu.profile import tracing
from jax_ipu.utils import protowire


def device_assignment_ids(serialized: bytes) -> list[list[int]]:
    """DeviceAssignmentProto -> ids[replica][partition]. jaxlib exposes no
    reader for it, and it is three fields: replica_count (1),
    computation_count (2), computation_devices (3, each a list of device ids
    per replica)."""
    replicas, columns = 0, []
    for field, _, value in protowire.fields(serialized):
        if field == 1:
            replicas = value
        elif field == 3:
            ids = []
            for _, w, v in protowire.fields(value):
                if w == 2:  # packed
                    pos = 0
                    while pos < len(v):
                        x, pos = protowire.varint(v, pos)
                        ids.append(x)
                else:
                    ids.append(v)
            columns.append(ids)
    return [[column[r] for column in columns] for r in range(replicas)]


# This process, in saved programs that call host callbacks: the callback
# ids they hold name Python functions registered here, so such a program
# loads only in the process that compiled it.
PROCESS = uuid.uuid4().hex


class Executable:
    def __init__(self, client, program, name: str, fingerprint: bytes,
                 assignment: list[list[int]], serialized_assignment: bytes, stablehlo: str | None = None):
        self.client = client
        self.program = program
        self.name = name
        self.fingerprint = fingerprint
        self.assignment = assignment
        self._text = None
        # The StableHLO compiled, kept when xla_embed_ir_in_executable asks.
        self.stablehlo = stablehlo
        # The device of a one-device program (looked up on every call otherwise).
        # The device of a one-device program of this process (a remote one's runs elsewhere).
        self.single_device = client.local_device(assignment[0][0]) if len(assignment) * len(assignment[0]) == 1 \
            else None
        self.num_replicas = len(assignment)
        self.num_partitions = len(assignment[0])
        self.logical_ids = [(r, p) for r in range(self.num_replicas) for p in range(self.num_partitions)]
        self.device_ids = [assignment[r][p] for r, p in self.logical_ids]
        # This process's share of the assignment (all of it in one process):
        # JAX passes arguments for these devices only.
        processes = client.processes
        if processes is None:
            self.local_ranks = list(range(len(self.device_ids)))
            self.rank_process = None
        else:
            self.rank_process = [processes.process_of(d) for d in self.device_ids]
            self.local_ranks = [r for r, p in enumerate(self.rank_process) if p == processes.index]
            if len(set(self.rank_process)) == 1:
                self.rank_process = None          # one process runs it all: no exchanges across
        self.local_device_ids = [self.device_ids[r] for r in self.local_ranks]
        self.local_logical_ids = [self.logical_ids[r] for r in self.local_ranks]
        self.serialized_device_assignment = serialized_assignment
        self.output_specs = [ArraySpec.of(t.dtype, t.shape, _layout(program.output_layouts, i))
                             for i, t in enumerate(program.output_types)]
        self.output_types = [spec.pjrt_type for spec in self.output_specs]
        self.output_shapes = [spec.shape for spec in self.output_specs]
        self.input_specs = [ArraySpec.of(t.dtype, t.shape, _layout(program.input_layouts, i))
                            for i, t in enumerate(program.input_types)]
        self.donated = sorted(set(program.aliases.values()))
        self.donated_set = frozenset(self.donated)
        self.num_params = len(program.input_types)
        # Which arguments and results live in streaming memory (PJRT memory
        # index 1), and their JAX memory kinds.
        self.input_memories = [1 if i in program.streaming_inputs else 0 for i in range(self.num_params)]
        self.output_memories = [1 if i in program.streaming_outputs else 0 for i in range(len(self.output_specs))]
        self.streaming_outputs = any(self.output_memories)
        self.parameter_memory_kinds = [Device.memories[m][0] for m in self.input_memories]
        self.output_memory_kinds = [Device.memories[m][0] for m in self.output_memories]
        self.cost_analysis = {k: float(v) for k, v in program.cost_analysis().items()}
        self.memory_stats = program.memory_stats()
        # Serialized xla.OpSharding per argument and result (None: unknown).
        self.parameter_shardings, self.output_shardings = executable_shardings(
            program.shardings, self.num_params, len(self.output_specs))
        self.keepalive: list = []  # what the C structs point at
        self.program_hash = fingerprint.decode()   # what processes compare (Client.compile narrows it)
        self.quick = is_quick(program, len(self.device_ids))
        # A run's completion event is its last output's, except for programs
        # that call the host: JAX keeps their completion events as runtime
        # tokens and waits on them at every effects_barrier (and at exit),
        # so a failed run's error goes to its outputs only, as on XLA:CPU,
        # not to an event that would re-raise it ever after.
        # The host callbacks the program calls (its feeds among them).
        self.host_callback_ids = frozenset(_host_callback_ids(program.body))
        self.own_completion = bool(self.output_specs) and bool(self.host_callback_ids)
        self.last_output_completes = bool(self.output_specs) and not self.own_completion
        self._returns_when_done = None
        # Whether the compiled module dispatches its calls (a _capi.QuickPath,
        # which its C handle holds): quick runs on one device of this process
        # whose outputs take no streaming memory.
        self.dispatch_compiled = self.quick and self.single_device is not None and not self.streaming_outputs

    # -- saved and loaded (PJRT_Executable_Serialize, DeserializeAndLoad) --
    def serialize(self) -> bytes:
        """The program in graph.serialize's format, with what loading it
        needs besides: name, fingerprint, device assignment and, for
        programs calling the host, the process whose callbacks they name."""
        from jax_ipu.graph import serialize

        meta = {"kind": EXECUTABLE_KIND, "name": self.name, "fingerprint": self.fingerprint,
                "assignment": [[int(d) for d in row] for row in self.assignment],
                "device_assignment": self.serialized_device_assignment,
                "callbacks": PROCESS if self.host_callback_ids else None}
        if self.stablehlo is not None:
            meta["stablehlo"] = self.stablehlo
        return serialize.dumps(self.program, meta)

    def optimized_program(self) -> tuple[bytes, bytes]:
        """(format, text) for PJRT_Executable_OptimizedProgram: XLA reads
        it for the executable's layouts at every compile, and prints it as
        HLO for compiled.as_text(). So it is small: the program's signature
        (results as zeros) and, as the module's frontend attribute
        `ipu_program`, what the IPU runs: compute sets, copies, cycles,
        memory (the StableHLO itself is lowered.as_text(), and the
        attribute `stablehlo` when xla_embed_ir_in_executable asked)."""
        if self._text is None:
            self._text = program_text(self.program.name, self.program, self.stablehlo).encode()
        return b"mlir", self._text

    # -- execution --
    def execute(self, args: list[list[DeviceBuffer]], device_id: int | None,
                non_donatable: set[int] | None):
        """Prepares the program's run on each device: returns the (pending)
        outputs, a completion event per device, the indices of the donated
        arguments, the runs to hand to launch() once the caller is done
        with the outputs (so the device does not contend with it), or None
        when the run is quick and already queued (deferred, see DeviceWorker)
        or has run in place, and the error the call raises (see launch) of
        a run in place."""
        ids = self.local_device_ids if device_id is None else (device_id,)
        if len(args) != len(ids):
            raise IpuInvalidArgument(f"{self.name} runs on {len(ids)} IPUs but got argument "
                                     f"lists for {len(args)}")
        if non_donatable:
            donated = [i for i in self.donated if i not in non_donatable]
            donated_set = frozenset(donated)
        else:
            donated, donated_set = self.donated, self.donated_set
        if donated:
            for row in args:
                _check_donations(row, donated_set)
        if len(ids) == 1 and (device_id is not None or len(self.device_ids) == 1):
            # one device (its quick calls mostly dispatched by _capi.QuickPath, which hands the rest here)
            device = self.single_device if device_id is None else self.client.device(device_id)
            worker = device.worker
            if worker._jobs:
                worker.help()        # quick runs still waiting: their results may be our arguments
            row = args[0]
            outs = self._outputs(device)
            # Complete when the last output is: runs fulfil outputs in order.
            done = outs[-1].ready if self.last_output_completes else Event()
            run = _Run(self, device, row, donated_set, outs, done)
            if worker.thread_ident == get_ident():
                # A host callback of a program running on this IPU runs
                # this one: now, in place (queued, it would wait behind
                # the run that waits for it), as XLA:CPU allows.
                if not run.all_held:
                    raise IpuRuntimeError(
                        f"{self.name} is called from a host callback of a program running on {device.to_string} "
                        "with an argument that is still being computed there: it cannot run before that "
                        "program ends. Pass host values (numpy arrays) to programs run inside callbacks")
                run()
                return [outs], [done], donated, None, self._failure([run]) if self.returns_when_done else None
            if self.quick and not run.waits_elsewhere:
                # Deferred: nothing runs before the caller has wrapped the outputs.
                worker.submit(run, True)
                return [outs], [done], donated, None, None
            return [outs], [done], donated, [run], None
        outputs, events, runs = [], [], []
        launch = None
        if self.rank_process is not None:     # replicas in other processes too
            from jax_ipu.pjrt.distributed import ProcessLinks
            remote = ProcessLinks(self.client.processes, self.program.name, self.program_hash, self.rank_process)
            launch = links.Launch(len(self.device_ids), self.client.config.collective_timeout, self.local_ranks,
                                  remote)
        elif len(ids) > 1:
            launch = links.Launch(len(ids), self.client.config.collective_timeout)   # the replicas' IPU-Links
        ranks = self.local_ranks if device_id is None else [0]
        for rank, device_id, row in zip(ranks, ids, args, strict=True):
            device = self.client.device(device_id)
            if device.worker.on_worker_thread():
                raise IpuRuntimeError(
                    f"{self.name} runs on {len(ids)} IPUs and is called from a host callback of a program "
                    f"running on {device.to_string}: it would wait for that program forever. Run it on other "
                    "devices, or after that program")
            outs = self._outputs(device)
            done = outs[-1].ready if self.last_output_completes else Event()
            replica = links.Replica(launch, rank, *divmod(rank, self.num_partitions)) if launch else None
            runs.append(_Run(self, device, row, donated_set, outs, done, replica))
            outputs.append(outs)
            events.append(done)
        return outputs, events, donated, runs, None

    @property
    def returns_when_done(self) -> bool:
        """Whether a call returns once the run has ended: programs calling
        the host do, as on XLA:CPU (what their callbacks print or record is
        there when the call returns: code and tests read it next), unless a
        callback may wait for what the caller does after the call (an
        infeed waiting for its items)."""
        if self._returns_when_done is None:
            ids = self.host_callback_ids
            self._returns_when_done = bool(ids) and not (host_waits is not None and any(map(host_waits, ids)))
        return self._returns_when_done

    _submitting = threading.Lock()

    @classmethod
    def launch(cls, runs: list) -> BaseException | None:
        """Submits the runs. A call that returns once they have ended
        (returns_when_done) returns the error of a failed one, which the
        call raises, as XLA:CPU raises a callback's error from the call
        that runs it; other calls give errors to the runs' outputs."""
        cls._submit(runs)
        executable = runs[0].executable
        if not executable.returns_when_done:
            return None
        _wait_for(runs)
        return executable._failure(runs)

    @staticmethod
    def _failure(runs: list) -> BaseException | None:
        """The error of the first run that failed by itself: a replica
        that failed because another did (IpuReplicaFailed) says less than
        the one whose callback raised."""
        errors = [run.error for run in runs if run.error is not None]
        if not errors:
            return None
        return next((e for e in errors if not isinstance(e, IpuReplicaFailed)), errors[0])

    @classmethod
    def _submit(cls, runs: list) -> None:
        replica = runs[0].replica
        if replica is not None and replica.launch.remote is not None:
            with cls._submitting:      # its turn among launches spanning processes: launch order
                replica.launch.remote.ticket = replica.launch.remote.processes.ticket()
                for run in runs:
                    run.device.worker.submit(run)
            return
        if len(runs) == 1:   # nothing to keep in step with
            run = runs[0]
            # Arguments still to come from this IPU's earlier runs are ready by
            # the time the run starts (one at a time, in order): it cannot block.
            run.device.worker.submit(run, run.executable.quick and not run.waits_elsewhere)
            return
        # One launch's runs reach every worker before another's: the
        # replicas of two launches must not meet in opposite orders.
        with cls._submitting:
            for run in runs:
                run.device.worker.submit(run)

    def _outputs(self, device) -> list[DeviceBuffer]:
        specs = self.output_specs
        if self.streaming_outputs:
            return [DeviceBuffer(device, spec, memory=m) for spec, m in zip(specs, self.output_memories, strict=True)]
        if len(specs) == 1:      # (the common case, paid on every call)
            return [DeviceBuffer(device, specs[0])]
        return [DeviceBuffer(device, spec) for spec in specs]

    def _argument_error(self, row: list[DeviceBuffer], device) -> None:
        specs = self.input_specs
        if len(row) != len(specs):
            raise IpuInvalidArgument(f"{self.name} takes {len(specs)} arguments, got {len(row)}")
        for i, (buf, expected) in enumerate(zip(row, specs, strict=True)):
            spec = buf.spec
            if spec.shape != expected.shape or spec.dtype != expected.dtype:
                raise IpuInvalidArgument(f"argument {i} of {self.name}: expected "
                                         f"{expected.dtype.name}{list(expected.shape)}, "
                                         f"got {buf.dtype.name}{list(buf.shape)}")
            if buf.device is not device:
                raise IpuInvalidArgument(f"argument {i} of {self.name} is on {buf.device.to_string}, "
                                         f"not on {device.to_string}")
            if spec.layout != expected.layout:
                raise IpuInvalidArgument(
                    f"argument {i} of {self.name} is in layout {_named(spec.layout, spec.shape)} but the program "
                    f"was compiled for {_named(expected.layout, expected.shape)}: move it with "
                    "jax.device_put(x, Format(layout, sharding)) first")
            if buf.memory != self.input_memories[i]:
                raise IpuInvalidArgument(
                    f"argument {i} of {self.name} is in memory kind {Device.memories[buf.memory][0]!r} but the "
                    f"program was compiled for {Device.memories[self.input_memories[i]][0]!r}: move it with "
                    "jax.device_put(x, sharding.with_memory_kind(...)) first")


def _layout(layouts: tuple, i: int) -> tuple[int, ...] | None:
    return layouts[i] if layouts else None


def _named(layout: tuple[int, ...] | None, shape: tuple[int, ...]) -> str:
    return f"Layout(major_to_minor={layout or tuple(range(len(shape)))})"


def _check_donations(row: list[DeviceBuffer], donated: frozenset) -> None:
    """A buffer donated at one position may not appear at another: the run
    would read what it gave away (XLA refuses this too)."""
    if len({id(b) for b in row}) == len(row):
        return
    first: dict[int, int] = {}
    for i, buf in enumerate(row):
        j = first.setdefault(id(buf), i)
        if j != i and (i in donated or j in donated):
            what = "donated twice" if i in donated and j in donated else "donated and also passed undonated"
            raise IpuInvalidArgument(
                f"the same array is arguments {j} and {i} of one call and is {what}; pass a copy "
                f"(e.g. jnp.copy(x)) for one of them, or do not donate it")


EXECUTABLE_KIND = "jax-ipu executable"


# What an MLIR string literal spells \XX (per byte of its UTF-8) besides
# newlines: whatever is not printable ASCII.
_UNPRINTABLE = re.compile(r"[^ -~]+")


def _mlir_string(text: str) -> str:
    # Not character by character in Python: the summary of a large
    # program, made at every load, is half a million characters (and lines).
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\0A")
    if _UNPRINTABLE.search(text):
        text = _UNPRINTABLE.sub(lambda m: "".join(f"\\{b:02X}" for b in m.group().encode()), text)
    return '"' + text + '"'


def program_text(name: str, program, stablehlo: str | None = None) -> str:
    """MLIR text of the program's signature, returning zeros, with its
    summary as the module's frontend attribute `ipu_program` (and the
    StableHLO it was compiled from as `stablehlo`, when given)."""
    from jax_ipu import ir

    def type_of(t) -> str:
        return str(ir.TensorType(tuple(t.shape), t.dtype))

    def zero(t) -> str:
        kind = t.dtype.kind
        value = {"b": "false", "f": "0.0", "c": "(0.0, 0.0)"}.get(kind, "0")
        return f"stablehlo.constant dense<{value}> : {type_of(t)}"

    args = ", ".join(f"%arg{i}: {type_of(t)}" for i, t in enumerate(program.input_types))
    results = [type_of(t) for t in program.output_types]
    symbol = name if re.fullmatch(r"[A-Za-z_][\w$.]*", name) else _mlir_string(name)
    attributes = f"ipu_program = {_mlir_string(program.summary())}"
    if stablehlo is not None:
        attributes += f", stablehlo = {_mlir_string(stablehlo)}"
    layouts = ""
    if program.input_layouts or program.output_layouts:
        # XLA reads the executable's layouts from these (XLA's minor to major).
        def minor_to_major(layout_list, types) -> str:
            dense = []
            for i, t in enumerate(types):
                order = _layout(layout_list, i) or tuple(range(len(t.shape)))
                dense.append(f"dense<[{', '.join(str(d) for d in order[::-1])}]> : tensor<{len(order)}xindex>"
                             if order else "dense<> : tensor<0xindex>")
            return "[" + ", ".join(dense) + "]"
        layouts = (f"mhlo.xla_entry_computation_parameter_layouts = "
                   f"{minor_to_major(program.input_layouts, program.input_types)}, "
                   f"mhlo.xla_entry_computation_result_layout = "
                   f"{minor_to_major(program.output_layouts, program.output_types)}, ")
    lines = [f"module @{symbol} attributes {{{layouts}mhlo.frontend_attributes = {{{attributes}}}}} {{",
             f"  func.func public @main({args}) -> ({', '.join(results)}) {{"]
    lines += [f"    %{i} = {zero(t)}" for i, t in enumerate(program.output_types)]
    lines += [f"    return {', '.join(f'%{i}' for i in range(len(results)))}"
              f"{' : ' + ', '.join(results) if results else ''}", "  }", "}"]
    return "\n".join(lines)


def from_bytes(client, data: bytes, options: bytes | None) -> Executable:
    """An Executable from Executable.serialize's bytes, for `client`.
    `options`: a serialized CompileOptionsProto whose device assignment
    replaces the saved one (JAX's execution_devices)."""
    from jax_ipu.graph import serialize

    try:
        program, meta = serialize.loads(data)
    except serialize.ProgramFormatError as exc:
        raise IpuInvalidArgument(f"cannot load this IPU executable: {exc}") from None
    fields = {"kind": str, "name": str, "fingerprint": bytes, "assignment": list, "device_assignment": bytes,
              "callbacks": (str, type(None))}
    optional = {"stablehlo": str}
    if not set(fields) <= set(meta) <= set(fields) | set(optional) or meta["kind"] != EXECUTABLE_KIND or not all(
            isinstance(meta[k], t) for k, t in {**fields, **optional}.items() if k in meta):
        raise IpuInvalidArgument("cannot load this IPU executable: it holds a program, not an executable")
    assignment = meta["assignment"]
    if not assignment or not all(type(row) is list and len(row) == len(assignment[0]) and row
                                 and all(type(d) is int for d in row) for row in assignment):
        raise IpuInvalidArgument("cannot load this IPU executable: malformed device assignment")
    target = client.target
    if (program.target_name, program.num_tiles) != (target.name, target.num_tiles):
        raise IpuInvalidArgument(
            f"{meta['name']} was compiled for {program.target_name} with {program.num_tiles} tiles; these IPUs "
            f"are {target.describe()} (JAX_IPU_TARGET, JAX_IPU_MODEL_NUM_TILES): compile it again")
    if meta["callbacks"] is not None and meta["callbacks"] != PROCESS:
        raise IpuInvalidArgument(
            f"{meta['name']} calls host callbacks (jax.debug.print, pure_callback, io_callback or feeds) of the "
            "process that compiled it; Python functions are not saved with a program, so it runs only there. "
            "Compile it again in this process")
    serialized = meta["device_assignment"]
    if options:
        from jaxlib._jax import CompileOptions
        proto = CompileOptions.ParseFromString(options).executable_build_options.device_assignment
        if proto is not None:
            serialized = proto.serialize()
            assignment = device_assignment_ids(serialized)
            if (len(assignment), len(assignment[0]) if assignment else 0) != (len(meta["assignment"]),
                                                                                  len(meta["assignment"][0])):
                raise IpuInvalidArgument(
                    f"{meta['name']} runs on {len(meta['assignment'])}x{len(meta['assignment'][0])} IPUs "
                    "(replicas x partitions), not on the devices given")
    for row in assignment:
        for device_id in row:
            client.any_device(device_id)
    return Executable(client, program, meta["name"], meta["fingerprint"], assignment, serialized,
                      meta.get("stablehlo"))


# Programs up to this many elements in all their tensors (and no loops) run
# in microseconds on the Model (see is_quick).
QUICK_ELEMENTS = 1 << 17


def _host_callback_ids(step):
    if isinstance(step, p.HostCall):
        yield step.callback_id
    for child in p.children(step):
        yield from _host_callback_ids(child)


# fn(callback id) -> whether that host callback may wait for what its caller
# does after dispatching the program (an infeed); installed by the front
# end that registers callbacks (jax_ipu.frontend.callbacks).
host_waits = None


def _wait_for(runs: list) -> None:
    """Waits for the runs to end (their completion events), in short sleeps
    so that Ctrl-C reaches the caller (the runs then go on, as dispatched)."""
    pause = 20e-6
    for run in runs:
        done = run.done
        while not done.is_ready:
            time.sleep(pause)
            pause = min(pause * 2, 0.005)


def is_quick(program, num_devices: int) -> bool:
    """Whether the program's runs are quick and cannot block: one device, no
    host calls (a callback or feed may wait for the host), no loops, and
    little data. Such a run may wait DeviceWorker.GRACE_SECONDS for the
    worker or run on the next thread that needs the device: handing it to
    the worker thread would cost more than running it."""
    if num_devices != 1 or sum(t.size for t in program.tensors) > QUICK_ELEMENTS:
        return False
    def blocks_or_loops(step) -> bool:
        if isinstance(step, (p.HostCall, p.Repeat, p.RepeatWhileTrue)):
            return True
        return any(blocks_or_loops(child) for child in p.children(step))
    return not blocks_or_loops(program.body)


_EMPTY_TOKEN = np.zeros((0,), np.bool_)
_EMPTY_TOKEN.setflags(write=False)


class _Run:
    """One execution on one device's worker."""

    __slots__ = ("executable", "program", "device", "args", "held", "all_held", "waits_elsewhere",
                 "donated", "outputs", "done", "replica", "error")

    def __init__(self, executable, device, args, donated, outputs, done, replica=None):
        """Checks the arguments against the program's (one pass over them
        with the next: it is paid on every call)."""
        self.executable, self.program = executable, executable.program
        self.device, self.args = device, args
        # The contents of the arguments ready now: the caller may delete its
        # arrays as soon as the call returns, as JAX allows.
        self.held = held = []
        all_held = True
        self.waits_elsewhere = False    # for an argument another IPU has still to produce
        if len(args) != executable.num_params:
            executable._argument_error(args, device)
        for buf, expected, memory in zip(args, executable.input_specs, executable.input_memories, strict=True):
            if buf.spec is not expected or buf.device is not device or buf.memory != memory:  # (specs are interned)
                executable._argument_error(args, device)
            array = buf._array
            if array is None:
                all_held = False
                if buf.device is not device:
                    self.waits_elsewhere = True
            held.append(array)
        self.all_held = all_held
        self.donated, self.outputs, self.done = donated, outputs, done
        self.replica = replica             # links.Replica when it runs with others
        self.error = None                  # why the run failed

    def __call__(self) -> None:
        traced = tracing.RUNNING       # inside a jax.profiler trace: when the run began
        began = time.time_ns() if traced else 0
        try:
            if self.replica is None:
                if self.all_held and not self.donated:    # the usual case: one call less
                    results = self.device.engine.run(self.program, self.held, (), False)
                else:
                    results = gather_and_run(self)
            else:
                with links.running(self.replica):   # a failure here releases the other replicas
                    results = gather_and_run(self)
        except BaseException as exc:  # reaches the user at the next sync point (or from the call: launch)
            self.error = exc
            if run_failed(self, exc):
                raise
            return
        device = self.device
        device.last_program = self.program
        # This launch's exchanges with other processes (None: it has none).
        replica = self.replica
        device.last_between_processes = between = (
            None if replica is None or replica.launch.remote is None else replica.launch.remote.counts)
        if traced or profile.ACTIVE is not None:
            record_run(self.program, device, between, began, traced)
        outputs = self.outputs
        if outputs:         # the last output's event is the run's completion
            for out, result in zip(outputs, results, strict=True):
                out.fulfil(result)
            if self.executable.own_completion:
                self.done.set()
        else:
            self.done.set()


# What a run (a _Run, or the compiled module's QuickRun) shares with the
# other kind: each reads the run's program, device, args, held, all_held,
# donated, outputs, done and executable.

def gather_and_run(run) -> list:
    """Runs the program once the arguments still being computed are ready,
    taking the donated ones."""
    args = run.args
    inputs = run.held if run.all_held else []
    for buf, held in zip(args, run.held, strict=True) if not run.all_held else ():
        if held is None:
            if buf.device is not run.device:
                buf.device.worker.urge()
            buf.ready.wait()
            held = buf.array()
        inputs.append(held)
    for i in run.donated:
        args[i].take()
    return run.device.engine.run(run.program, inputs, run.donated, checked=False)


def run_failed(run, exc: BaseException) -> bool:
    """Fails the run's outputs (or completion) with its error; whether the
    caller re-raises it (Ctrl-C during a quick run on the user's thread)."""
    tokens = run.program.token_outputs
    outputs = run.outputs
    # JAX passes the run's output token to the next program with
    # ordered effects: were it failed too, every later such program
    # would fail with this error (one failed callback or feed
    # timeout would stop them all, where the CPU goes on). The
    # error reaches the user through the run's other outputs; only
    # a run that has none fails its tokens.
    keep_tokens = len(tokens) < len(outputs)
    for i, out in enumerate(outputs):
        if keep_tokens and i in tokens:
            out.fulfil(_EMPTY_TOKEN)
        else:
            out.fail(exc)
    if not outputs:
        run.done.set(exc)
    elif run.executable.own_completion:   # the error is the outputs' (unless all are tokens)
        run.done.set(None if keep_tokens else exc)
    # Ctrl-C during a quick run on the user's thread interrupts the user.
    return isinstance(exc, KeyboardInterrupt) and not run.device.worker.on_worker_thread()


def record_run(program, device, between, began: int, traced) -> None:
    """Gives a finished run to the profile session and the jax.profiler
    traces running."""
    if profile.ACTIVE is not None:
        profile.ACTIVE.record(program, device, device.engine.last_run, between)
    if traced:
        tracing.record(program, device, device.engine.last_run, began)


set_run_hooks(gather_and_run, run_failed, record_run, _check_donations, DeviceBuffer, tracing, profile)


def fingerprint(code: bytes, options: bytes, target) -> bytes:
    digest = hashlib.sha256(code)
    digest.update(options)
    digest.update(repr(target).encode())
    return digest.hexdigest()[:32].encode()
