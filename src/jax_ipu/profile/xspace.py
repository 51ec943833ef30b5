"""The IPUs' runs in a trace as an XSpace: the protobuf that jax.profiler
writes (`*.xplane.pb`) and XProf, TensorBoard's profile plugin and
Perfetto (through JAX's `perfetto_trace.json.gz`) read.

One plane per IPU that ran, named `/device:CUSTOM:<id>`: the trace viewers
of JAX and XProf show a device plane only under the GPU, TPU or CUSTOM
prefix. Its lines, all in estimated IPU time (cycles / the target's clock):

    Programs      each run of a compiled program (jit_f), from its first
                  argument stream to its last result stream
    Steps         the executed compute sets, copies, collectives and host
                  callbacks, named as in the profile reports: the op and
                  the user's source line (`fused tanh @train.py:12:8 ...`)
    BSP phases    each step's exchange, compute and sync (a collective's
                  middle phase, "IPU-Links", is its transfers over the
                  IPU-Links with its reduction and the sync across IPUs)
    Host link     the argument and result streams

A step's cycles, kind, exchanged bytes, program and source line are stats
of its event metadata, shared by its every run (the viewers show them with
each event); a program's run has its number and cycles as its own. A run
starts on the host clock when the Model began it (JAX's host events share
that clock), or when the IPU's previous run ended in estimated time, if
later.

The messages are declared here from tsl/profiler/protobuf/xplane.proto's
field numbers, in a pool of their own.
"""
from __future__ import annotations

import re
import weakref

from jax_ipu.graph import codelets_collectives
from jax_ipu.graph.programs import DeviceToHost, Execute, HostToDevice, leaves

PLANE_PREFIX = "/device:CUSTOM:"
LINES = ("Programs", "Steps", "BSP phases", "Host link")
PROGRAMS, STEPS, PHASES, HOST_LINK = range(len(LINES))
KINDS = {"Execute": "compute set", "Copy": "copy", "HostCall": "host callback",
         # a control step's decision: a loop's iteration, a branch taken
         "Repeat": "loop", "RepeatWhileTrue": "loop", "If": "branch", "Switch": "branch"}
_SOURCE = re.compile(r"@(\S+?:\d+(?::\d+)?)")


def _messages() -> dict:
    """XSpace and the messages inside it, as protobuf classes."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as exc:
        raise ImportError("jax-ipu writes the IPUs' part of a jax.profiler trace with the protobuf "
                          "package: pip install 'protobuf>=4.25'") from exc

    F = descriptor_pb2.FieldDescriptorProto
    types = {"int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64, "double": F.TYPE_DOUBLE,
             "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES}
    package = "tensorflow.profiler"
    spec = {   # message: [(field, number, type, repeated, oneof)]
        "XSpace": [("planes", 1, "XPlane", True, None), ("errors", 2, "string", True, None),
                   ("warnings", 3, "string", True, None), ("hostnames", 4, "string", True, None)],
        "XPlane": [("id", 1, "int64", False, None), ("name", 2, "string", False, None),
                   ("lines", 3, "XLine", True, None), ("event_metadata", 4, "map:XEventMetadata", True, None),
                   ("stat_metadata", 5, "map:XStatMetadata", True, None), ("stats", 6, "XStat", True, None)],
        "XLine": [("id", 1, "int64", False, None), ("name", 2, "string", False, None),
                  ("timestamp_ns", 3, "int64", False, None), ("events", 4, "XEvent", True, None),
                  ("duration_ps", 9, "int64", False, None), ("display_id", 10, "int64", False, None),
                  ("display_name", 11, "string", False, None)],
        "XEvent": [("metadata_id", 1, "int64", False, None), ("offset_ps", 2, "int64", False, 0),
                   ("num_occurrences", 5, "int64", False, 0), ("duration_ps", 3, "int64", False, None),
                   ("stats", 4, "XStat", True, None)],
        "XStat": [("metadata_id", 1, "int64", False, None), ("double_value", 2, "double", False, 0),
                  ("uint64_value", 3, "uint64", False, 0), ("int64_value", 4, "int64", False, 0),
                  ("str_value", 5, "string", False, 0), ("bytes_value", 6, "bytes", False, 0),
                  ("ref_value", 7, "uint64", False, 0)],
        "XEventMetadata": [("id", 1, "int64", False, None), ("name", 2, "string", False, None),
                           ("metadata", 3, "bytes", False, None), ("display_name", 4, "string", False, None),
                           ("stats", 5, "XStat", True, None), ("child_id", 6, "int64", True, None)],
        "XStatMetadata": [("id", 1, "int64", False, None), ("name", 2, "string", False, None),
                          ("description", 3, "string", False, None)],
    }
    oneofs = {"XEvent": "data", "XStat": "value"}
    file = descriptor_pb2.FileDescriptorProto(name="jax_ipu/xplane.proto", package=package, syntax="proto3")

    def add_field(message, name, number, kind, repeated, oneof):
        field = message.field.add(name=name, number=number,
                                  label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if kind in types:
            field.type = types[kind]
        else:
            field.type, field.type_name = F.TYPE_MESSAGE, f".{package}.{kind}"
        if oneof is not None:
            field.oneof_index = oneof

    for name, fields in spec.items():
        message = file.message_type.add(name=name)
        if name in oneofs:
            message.oneof_decl.add(name=oneofs[name])
        for field, number, kind, repeated, oneof in fields:
            if kind.startswith("map:"):
                entry_name = "".join(part.title() for part in field.split("_")) + "Entry"
                entry = message.nested_type.add(name=entry_name)
                entry.options.map_entry = True
                add_field(entry, "key", 1, "int64", False, None)
                add_field(entry, "value", 2, kind[4:], False, None)
                add_field(message, field, number, f"{name}.{entry_name}", True, None)
            else:
                add_field(message, field, number, kind, repeated, oneof)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
            for name in spec}


_MESSAGES: dict | None = None


def messages() -> dict:
    global _MESSAGES
    if _MESSAGES is None:
        _MESSAGES = _messages()
    return _MESSAGES


def parse(data: bytes):
    """An XSpace message from its serialized bytes."""
    space = messages()["XSpace"]()
    space.ParseFromString(data)
    return space


# Per program: (kind, name, cycles, exchanged bytes) -> (kind as users say
# it, exchange cycles, sync cycles) of its steps, and its host streams; built once per program.
_STEP_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_info(program) -> tuple[dict, list]:
    found = _STEP_INFO.get(program)
    if found is None:
        from jax_ipu.profile.report import _phases
        info = {key: (KINDS[key[0]], exchange, sync) for key, (exchange, sync) in _phases(program).items()}
        streams = []
        for step in leaves(program.body):
            if isinstance(step, Execute) and isinstance(step.compute_set.kernel, codelets_collectives.COLLECTIVES):
                key = ("Execute", step.compute_set.name, int(step.cycles), int(step.exchange_bytes))
                info[key] = ("collective",) + info[key][1:]
            elif isinstance(step, (HostToDevice, DeviceToHost)):
                streams.append(step)
        found = _STEP_INFO[program] = (info, streams)
    return found


class _Plane:
    """One IPU's plane being filled: its lines, and the metadata of its
    events (a name with the stats every event of it shares: a step's
    cycles, kind, program and source line) made once each."""

    def __init__(self, space, device_id: int, description: str, timestamp_ns: int):
        self.plane = space.planes.add(id=device_id, name=f"{PLANE_PREFIX}{device_id}")
        self.metadata_ids: dict[tuple, int] = {}
        self.stat_ids: dict[str, int] = {}
        self.steps: dict[tuple, tuple] = {}    # a step of a program -> its metadata, length, phases
        self.lines = [self.plane.lines.add(id=i, display_id=i, name=name, display_name=name,
                                           timestamp_ns=timestamp_ns)
                      for i, name in enumerate(LINES)]
        self.plane.stats.append(self._stat("device", f"IPU {device_id}: {description}"))

    def _stat(self, name: str, value):
        sid = self.stat_ids.get(name)
        if sid is None:
            sid = self.stat_ids[name] = len(self.stat_ids) + 1
            self.plane.stat_metadata[sid].id = sid
            self.plane.stat_metadata[sid].name = name
        stat = messages()["XStat"](metadata_id=sid)
        if isinstance(value, str):
            stat.str_value = value
        else:
            stat.int64_value = int(value)
        return stat

    def metadata(self, name: str, **stats) -> int:
        key = (name, *stats.items())
        mid = self.metadata_ids.get(key)
        if mid is None:
            mid = self.metadata_ids[key] = len(self.metadata_ids) + 1
            metadata = self.plane.event_metadata[mid]
            metadata.id, metadata.name, metadata.display_name = mid, name, name
            source = _SOURCE.search(name)
            if source:
                stats["source"] = source.group(1)
            metadata.stats.extend(self._stat(k, v) for k, v in stats.items())
        return mid

    def event(self, line: int, mid: int, offset_ps: int, duration_ps: int, **stats) -> None:
        event = self.lines[line].events.add(metadata_id=mid, offset_ps=offset_ps, duration_ps=duration_ps)
        if stats:
            event.stats.extend(self._stat(k, v) for k, v in stats.items())

    def step(self, program, info: dict, step: tuple, ps) -> tuple:
        """(metadata id, length in ps, [(metadata id, length)] of its phases)
        of one of the program's steps, (kind, name, cycles, exchanged bytes)."""
        key = (id(program), *step)
        found = self.steps.get(key)
        if found is None:
            kind, name, cycles, nbytes = step
            what, exchange, sync = info.get((kind, name, int(cycles), int(nbytes)), (KINDS.get(kind, kind), 0, 0))
            mid = self.metadata(name, kind=what, cycles=cycles, exchange_bytes=nbytes, program=program.name)
            phases = []
            if what != "host callback" and exchange + sync <= cycles:
                middle = "IPU-Links" if what == "collective" else "compute"
                for phase, part in (("exchange", exchange), (middle, cycles - exchange - sync), ("sync", sync)):
                    if part > 0:
                        phases.append((self.metadata(phase, cycles=part), ps(part)))
            found = self.steps[key] = (mid, ps(cycles), phases)
        return found

    def finish(self, end_ps: int) -> None:
        for line in self.lines:
            line.duration_ps = end_ps


def build(runs: list, start_ns: int, hostname: str = ""):
    """The XSpace of recorded runs: (program, device, RunRecord or
    tracing.PartRun, start ns, index of the run in the trace) each, placed
    on their IPU's timeline from start_ns on (the trace's start, which
    every line's timestamp is). A warning counts the steps not kept."""
    space = messages()["XSpace"]()
    if hostname:
        space.hostnames.append(hostname)
    planes: dict[int, _Plane] = {}
    ends: dict[int, int] = {}       # device id -> ps where its last run ended
    unlisted, kept = 0, 0
    for program, device, run, at_ns, number in runs:
        plane = planes.get(device.id)
        if plane is None:
            plane = planes[device.id] = _Plane(space, device.id, device.target.describe(), start_ns)
        scale = 1e12 / device.target.clock_hz

        def ps(cycles: int, scale=scale) -> int:
            return round(cycles * scale)

        begin = max((at_ns - start_ns) * 1000, ends.get(device.id, 0))
        now = begin
        info, streams = _step_info(program)
        for stream in streams:
            if isinstance(stream, HostToDevice):
                mid = plane.metadata(f"argument {stream.index} to IPU", cycles=stream.cycles,
                                     bytes=stream.tensor.nbytes)
                plane.event(HOST_LINK, mid, now, ps(stream.cycles))
                now += ps(stream.cycles)
        steps = run.steps
        kept += len(steps)
        unlisted += getattr(run, "unlisted_steps", 0)
        add_step, add_phase = plane.lines[STEPS].events.add, plane.lines[PHASES].events.add
        for step in steps:
            mid, length, phases = plane.step(program, info, step, ps)
            add_step(metadata_id=mid, offset_ps=now, duration_ps=length)
            at = now
            for phase_mid, part in phases:
                add_phase(metadata_id=phase_mid, offset_ps=at, duration_ps=part)
                at += part
            now += length
        now += ps(getattr(run, "unlisted_cycles", 0))       # steps not kept: their time passes
        for stream in streams:
            if isinstance(stream, DeviceToHost):
                mid = plane.metadata(f"result {stream.index} to host", cycles=stream.cycles,
                                     bytes=stream.src.size * stream.src.dtype.itemsize)
                plane.event(HOST_LINK, mid, now, ps(stream.cycles))
                now += ps(stream.cycles)
        plane.event(PROGRAMS, plane.metadata(program.name), begin, now - begin, run=number, cycles=run.cycles,
                    host_cycles=program.host_cycles)
        ends[device.id] = now
    for device_id, plane in planes.items():
        plane.finish(ends[device_id])
    if unlisted:
        space.warnings.append(f"jax-ipu: {unlisted} IPU steps beyond the first {kept} of this trace "
                              "are not shown")
    return space
