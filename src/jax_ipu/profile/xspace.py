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

Each event carries its cycles and bytes as stats. A run starts on the host
clock when the Model began it (JAX's host events share that clock), or when
the IPU's previous run ended in estimated time, if later.

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
KINDS = {"Execute": "compute set", "Copy": "copy", "HostCall": "host callback"}
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


# Per program: (kind, name) -> (kind as users say it, exchange cycles, sync
# cycles) of its steps, and its host streams; built once per program.
_STEP_INFO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _step_info(program) -> tuple[dict, list]:
    found = _STEP_INFO.get(program)
    if found is None:
        from jax_ipu.profile.report import _phases
        info = {key: (KINDS[key[0]], exchange, sync) for key, (exchange, sync) in _phases(program).items()}
        streams = []
        for step in leaves(program.body):
            if isinstance(step, Execute) and isinstance(step.compute_set.kernel, codelets_collectives.COLLECTIVES):
                key = ("Execute", step.compute_set.name)
                info[key] = ("collective",) + info[key][1:]
            elif isinstance(step, (HostToDevice, DeviceToHost)):
                streams.append(step)
        found = _STEP_INFO[program] = (info, streams)
    return found


class _Plane:
    """One IPU's plane being filled: metadata ids by name, and its lines."""

    def __init__(self, space, device_id: int, description: str, timestamp_ns: int):
        self.plane = space.planes.add(id=device_id, name=f"{PLANE_PREFIX}{device_id}")
        self.events: dict[str, int] = {}
        self.stats: dict[str, int] = {}
        self.lines = [self.plane.lines.add(id=i, display_id=i, name=name, display_name=name,
                                           timestamp_ns=timestamp_ns)
                      for i, name in enumerate(LINES)]
        self.plane.stats.append(self._stat("device", f"IPU {device_id}: {description}"))

    def _stat_id(self, name: str) -> int:
        sid = self.stats.get(name)
        if sid is None:
            sid = self.stats[name] = len(self.stats) + 1
            self.plane.stat_metadata[sid].id = sid
            self.plane.stat_metadata[sid].name = name
        return sid

    def _stat(self, name: str, value):
        stat = messages()["XStat"](metadata_id=self._stat_id(name))
        if isinstance(value, str):
            stat.str_value = value
        else:
            stat.int64_value = int(value)
        return stat

    def event(self, line: int, name: str, offset_ps: int, duration_ps: int, **stats) -> None:
        mid = self.events.get(name)
        if mid is None:
            mid = self.events[name] = len(self.events) + 1
            metadata = self.plane.event_metadata[mid]
            metadata.id, metadata.name, metadata.display_name = mid, name, name
            source = _SOURCE.search(name)
            if source:
                metadata.stats.append(self._stat("source", source.group(1)))
        event = self.lines[line].events.add(metadata_id=mid, offset_ps=offset_ps, duration_ps=duration_ps)
        event.stats.extend(self._stat(k, v) for k, v in stats.items())

    def finish(self, end_ps: int) -> None:
        for line in self.lines:
            line.duration_ps = end_ps


def build(runs: list, start_ns: int, max_events: int, hostname: str = ""):
    """The XSpace of recorded runs: (program, device, RunRecord, start ns,
    index of the run in the trace) each, placed on their IPU's timeline
    from start_ns on (the trace's start, which every line's timestamp is).
    At most max_events step events; beyond, a warning says how many more."""
    space = messages()["XSpace"]()
    if hostname:
        space.hostnames.append(hostname)
    planes: dict[int, _Plane] = {}
    ends: dict[int, int] = {}       # device id -> ps where its last run ended
    left, dropped = max_events, 0
    for program, device, run, at_ns, number in runs:
        plane = planes.get(device.id)
        if plane is None:
            plane = planes[device.id] = _Plane(space, device.id, device.target.describe(), start_ns)
        scale = 1e12 / device.target.clock_hz

        def ps(cycles: int) -> int:
            return round(cycles * scale)

        begin = max((at_ns - start_ns) * 1000, ends.get(device.id, 0))
        now = begin
        info, streams = _step_info(program)
        for stream in streams:
            if isinstance(stream, HostToDevice):
                plane.event(HOST_LINK, f"argument {stream.index} to IPU", now, ps(stream.cycles),
                            cycles=stream.cycles, bytes=stream.tensor.nbytes)
                now += ps(stream.cycles)
        steps = run.steps
        if len(steps) > left:
            dropped += len(steps) - left
            steps = steps[:left]
        left -= len(steps)
        for kind, name, cycles, nbytes in steps:
            what, exchange, sync = info.get((kind, name), (KINDS.get(kind, kind), 0, 0))
            length = ps(cycles)
            plane.event(STEPS, name, now, length, kind=what, cycles=cycles, exchange_bytes=nbytes,
                        program=program.name)
            if what != "host callback" and exchange + sync <= cycles:
                at = now
                middle = "IPU-Links" if what == "collective" else "compute"
                for phase, part in (("exchange", exchange), (middle, cycles - exchange - sync), ("sync", sync)):
                    if part > 0:
                        plane.event(PHASES, phase, at, ps(part), cycles=part)
                        at += ps(part)
            now += length
        for stream in streams:
            if isinstance(stream, DeviceToHost):
                plane.event(HOST_LINK, f"result {stream.index} to host", now, ps(stream.cycles),
                            cycles=stream.cycles, bytes=stream.src.size * stream.src.dtype.itemsize)
                now += ps(stream.cycles)
        plane.event(PROGRAMS, program.name, begin, now - begin, run=number, cycles=run.cycles,
                    host_cycles=program.host_cycles)
        ends[device.id] = now
    for device_id, plane in planes.items():
        plane.finish(ends[device_id])
    if dropped:
        space.warnings.append(f"jax-ipu: {dropped} IPU steps beyond the first {max_events} of this trace "
                              "are not shown")
    return space
