"""A compiled Program as bytes and back, without pickle: a JSON header (the
schema-checked tree of the program's objects) and a block of arrays.

    bytes  0-7    magic b"JAXIPUPG"
           8-11   format version (little-endian u32)
           12-19  header length in bytes (u64)
           20-27  length of the uncompressed body (u64)
           28-35  length of the compressed body (u64)
           36-43  length of the uncompressed deferred section (u64)
           44-75  sha256 of everything after these 76 bytes
           76-    the body, zlib-compressed: the header (UTF-8 JSON), then
                  the arrays, each part aligned to 64 bytes; then the
                  deferred section, compressed on its own: the arrays that
                  running never reads (vertex table but for its tiles, tile
                  mappings), inflated when one of them is first read

Loading never runs code from the bytes: the header is parsed with `json`,
arrays are read with np.frombuffer from a table of (dtype, shape, offset)
whose dtypes come from a fixed list, and objects are built only from the
classes of the graph layer named in `_SCHEMA`, each field checked against
its entry there. Anything malformed (a wrong digest, a field missing or of
the wrong type, a reference out of range, a view whose ops do not give its
shape) raises ProgramFormatError naming what and where: at load, or for
what needs the values of a deferred array (its runs, its ranges), when
that array is first read.

Sizes grow with the program, not with tiles x elements: tile mappings are
stored as runs, the vertices of all compute sets as one table of arrays
(codelet, tile, cycles, regions), interval arrays that vertices share are
stored once, a block of intervals that repeats over rows (an outer
reduction's columns in each reduced row, graph.compute.RowIntervals) as
its first row, a row count and a stride, and integer arrays whose
differences repeat (gather indices, interval starts) as runs of equal
differences; im2col patches and pooling
windows are "windows" view ops: a few integers each.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import json
import math
import struct
import threading
import zlib

import ml_dtypes
import numpy as np

from jax_ipu import ir

# The kernel classes register their records (graph.records.RECORDS) when imported.
from jax_ipu.graph import codelets, codelets_collectives, codelets_conv, codelets_indexing, codelets_linalg  # noqa: F401
from jax_ipu.graph import programs as p
from jax_ipu.graph.compute import (
    ComputeSet,
    DataDependentExchange,
    Region,
    RowIntervals,
    Vertex,
    VertexArray,
    csr_part,
)
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.memory import MemoryReport
from jax_ipu.graph.program import Program
from jax_ipu.graph.records import RECORDS, is_immediate
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import _SHAPE, Concat, View
from jax_ipu.utils import gc_pause

MAGIC = b"JAXIPUPG"
FORMAT_VERSION = 7   # 3: StreamingCopy steps, argument and result layouts; 4: control steps' costs; 5: emulated ops;
#                       6: the memory report's breakdown; 7: interval blocks repeated as rows
_MARK = struct.Struct("<8sI")
PREFIX = struct.Struct("<8sIQQQQ32s")
_ALIGN = 64


class ProgramFormatError(ValueError):
    """Bytes that are not a program this jax-ipu can load."""


def _fail(problem: str):
    raise ProgramFormatError(f"not a loadable jax-ipu program: {problem}")


# --------------------------------------------------------------- versions --

_PLUGIN_VERSION = None


def plugin_version() -> str:
    """jax-ipu's version and a digest of its installed sources: a program
    saved by other code (another release, or a changed checkout) is not
    loaded, since what its kernels mean may have changed."""
    global _PLUGIN_VERSION
    if _PLUGIN_VERSION is None:
        import pathlib

        from jax_ipu.version import __version__
        root = pathlib.Path(__file__).resolve().parent.parent     # the jax_ipu package
        digest = hashlib.sha256()
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".pyx", ".pxi", ".h") and path.is_file():
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
        _PLUGIN_VERSION = f"{__version__}+{digest.hexdigest()[:16]}"
    return _PLUGIN_VERSION


# ---------------------------------------------------------------- dtypes --

_DTYPES = {np.dtype(t).name: np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128, ml_dtypes.bfloat16)}


def _dtype(name, where) -> np.dtype:
    if not isinstance(name, str) or name not in _DTYPES:
        _fail(f"{_at(where)}: unknown element type {name!r}")
    return _DTYPES[name]


# ---------------------------------------------------------------- arrays --

def _narrow_size(values: np.ndarray) -> int:
    """The item size _narrow would give."""
    return _width(int(values.min()), int(values.max())) if values.size else 1


def _width(low: int, high: int) -> int:
    """Bytes of the smallest integer type holding low..high."""
    for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32):
        info = np.iinfo(t)
        if info.min <= low and high <= info.max:
            return np.dtype(t).itemsize
    return 8


def _narrow(values: np.ndarray) -> np.ndarray:
    """An integer array in the smallest integer type holding its values."""
    if values.size == 0:
        return values.astype(np.int8)
    low, high = int(values.min()), int(values.max())
    for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64):
        info = np.iinfo(t)
        if info.min <= low and high <= info.max:
            return values.astype(t, copy=False)
    return values


class _Writer:
    """Collects arrays: each gets an index into the header's table. Its
    parts go to the body, or to the deferred section (`deferred`: arrays
    that running never reads, inflated only when first read)."""

    def __init__(self):
        self.table: list = []
        self.parts: tuple[list, list] = ([], [])     # the body's, the deferred section's
        self.sizes = [0, 0]

    def _part(self, array: np.ndarray, section: int) -> list:
        # The array's own bytes (no copy when it is contiguous): a large
        # program's arrays are not held twice while saved.
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).reshape(-1)
        data = memoryview(data.view(np.uint8))
        size = self.sizes[section]
        offset = -(-size // _ALIGN) * _ALIGN
        if offset > size:
            self.parts[section].append(b"\0" * (offset - size))
        self.parts[section].append(data)
        self.sizes[section] = offset + len(data)
        return [array.dtype.name, offset, len(data)]

    @staticmethod
    def _steps(values: np.ndarray, shape, codec: str):
        """Differences along the elements ("runs") or between rows
        ("row-runs", of a matrix of rows, as im2col indices are)."""
        if codec == "runs":
            return np.diff(values, prepend=values.dtype.type(0))
        if len(shape) < 2 or not 1 < shape[-1] < values.size:
            return None
        rows = values.reshape(-1, shape[-1])
        return np.diff(rows, axis=0, prepend=np.zeros((1, rows.shape[1]), values.dtype)).reshape(-1)

    def add(self, array: np.ndarray, deferred: bool = False) -> int:
        array = np.asarray(array)
        if array.dtype.name not in _DTYPES:
            raise ProgramFormatError(f"cannot save an array of {array.dtype}")
        entry = {"dtype": array.dtype.name, "shape": list(array.shape)}
        section = int(deferred)
        if deferred:
            entry["deferred"] = True
        flat = array.reshape(-1)
        if array.dtype.kind in "iu" and array.dtype.itemsize <= 8 and flat.size >= 64 \
                and not (array.dtype == np.uint64 and int(flat.max()) > np.iinfo(np.int64).max):
            low, high = int(flat.min()), int(flat.max())
            # Differences of values within half int32's range fit in int32:
            # large index arrays (10^8 elements in large networks) are never widened.
            half = 1 << 30
            values = flat.astype(np.int32 if -half <= low and high < half else np.int64, copy=False)
            plain = _width(low, high) * flat.size
            # Each candidate's bytes before zlib, one at a time: the
            # smallest is stored, a coded one only if at most half the
            # plain size (decoding costs more than inflating plain bytes).
            best, best_size = "narrow", plain / 2
            for codec in ("runs", "row-runs"):
                steps = self._steps(values, array.shape, codec)
                if steps is None:
                    continue
                changes = 1 + int(np.count_nonzero(steps[1:] != steps[:-1]))
                size = changes * (_narrow_size(steps) + 4)
                if size < best_size:
                    best, best_size = codec, size
                del steps
            # Gathers whose positions are mostly padding (the read of a
            # dilated or strided convolution's gradient): which positions
            # are padding (the largest index), then the other indices as
            # differences.
            padding = values == high
            padded = int(np.count_nonzero(padding))
            if padded > 0.1 * flat.size:
                valid = values[~padding]
                steps = np.diff(valid, prepend=valid.dtype.type(0))
                if flat.size // 8 + _narrow_size(steps) * len(steps) < best_size:
                    best = "masked"
                    entry["fill"] = high
                    entry["parts"] = [self._part(np.packbits(padding), section), self._part(_narrow(steps), section)]
                del valid, steps
            del padding
            entry["codec"] = best
            if best == "narrow":
                entry["parts"] = [self._part(_narrow(values) if array.dtype != np.uint64 else flat, section)]
            elif best != "masked":
                steps = self._steps(values, array.shape, best)
                starts = np.concatenate(([0], np.flatnonzero(steps[1:] != steps[:-1]) + 1))
                counts = np.diff(np.append(starts, flat.size))
                entry["parts"] = [self._part(_narrow(steps[starts]), section), self._part(_narrow(counts), section)]
        else:
            entry["codec"] = "raw"
            entry["parts"] = [self._part(flat, section)]
        self.table.append(entry)
        return len(self.table) - 1


class _Section:
    """The deferred section's bytes, inflated when an array in it is first
    read (the vertices' regions and intervals and the tensors' tile
    mappings: most of a large program's bytes, read only by profiles and
    validation)."""

    def __init__(self, packed: memoryview, size: int):
        self._packed, self.size, self._body = packed, size, None
        self._lock = threading.Lock()     # (profiles are made on the devices' threads)

    def body(self) -> memoryview:
        with self._lock:
            if self._body is None:
                self._body = _inflate(self._packed, self.size, "its deferred section")
            return self._body


def _inflate(packed: memoryview, size: int, what: str) -> memoryview:
    """One zlib stream that inflates to exactly `size` bytes, as a
    writeable buffer (arrays are views of it, as compiled ones are writeable)."""
    inflate = zlib.decompressobj()
    try:
        out = bytearray(inflate.decompress(packed, size + 1))
    except zlib.error as exc:
        _fail(f"{what} does not inflate ({exc})")
    if len(out) != size or not inflate.eof or inflate.unused_data:
        _fail(f"{what} inflates to other than the {size} bytes it declares")
    return memoryview(out)


class _Deferred:
    """An array of the deferred section: its entry checked at load, its
    bytes inflated, checked and decoded on first use."""

    def __init__(self, shape, dtype, decode):
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)
        self._decode, self._value = decode, None

    def __len__(self) -> int:
        return self.shape[0]

    def value(self) -> np.ndarray:
        value = self._value
        if value is None:        # (two threads may both decode: the same array)
            value = self._value = self._decode()
        return value


def _resolved(array) -> np.ndarray:
    return array.value() if isinstance(array, _Deferred) else array


# How many parts each codec's entries have.
_CODEC_PARTS = {"raw": 1, "narrow": 1, "runs": 2, "row-runs": 2, "masked": 2}


def _read_arrays(table, body: memoryview, section: _Section) -> list:
    """The arrays of the table: those of the body decoded now, those of
    the deferred section as _Deferred. Every entry's fields and the
    bounds of its parts are checked here; what needs an array's values
    (runs adding up to its size) when it is decoded."""
    if not isinstance(table, list):
        _fail("the array table is not a list")
    out = []
    for i, entry in enumerate(table):
        where = f"array {i}"
        if not isinstance(entry, dict) or set(entry) - {"fill", "deferred"} != {"dtype", "shape", "codec", "parts"} \
                or ("fill" in entry) != (entry.get("codec") == "masked") or entry.get("deferred", True) is not True:
            _fail(f"{where}: malformed entry")
        deferred = "deferred" in entry
        dtype = _dtype(entry["dtype"], where)
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            _fail(f"{where}: bad shape {shape!r}")
        size = math.prod(shape)
        parts = entry["parts"]
        codec = entry["codec"]
        if codec not in _CODEC_PARTS or not isinstance(parts, list) or len(parts) != _CODEC_PARTS[codec]:
            _fail(f"{where}: unknown codec {codec!r} or wrong parts")
        limit = section.size if deferred else len(body)
        spans = []
        for part in parts:
            if not isinstance(part, list) or len(part) != 3:
                _fail(f"{where}: malformed part")
            pdtype = _dtype(part[0], where).newbyteorder("<")
            offset, nbytes = part[1], part[2]
            if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0 \
                    or offset + nbytes > limit or nbytes % pdtype.itemsize:
                _fail(f"{where}: part out of the data's bounds")
            spans.append((pdtype, offset, nbytes // pdtype.itemsize))
        counts = [n for _, _, n in spans]
        if codec == "raw":
            if spans[0][0] != dtype.newbyteorder("<") or counts[0] != size:
                _fail(f"{where}: holds {counts[0]} {spans[0][0]} elements, not {size} {dtype}")
        else:
            if dtype.kind not in "iu" or any(d.kind not in "iu" for d, _, _ in spans):
                _fail(f"{where}: codec {codec} of a non-integer array")
            if codec == "narrow":
                if counts[0] != size:
                    _fail(f"{where}: holds {counts[0]} elements, not {size}")
            elif codec == "masked":
                fill = entry["fill"]
                if spans[0][0] != np.uint8 or counts[0] != -(-size // 8) or type(fill) is not int \
                        or not np.iinfo(dtype).min <= fill <= np.iinfo(dtype).max:
                    _fail(f"{where}: malformed padding mask")
            else:
                if counts[0] != counts[1]:
                    _fail(f"{where}: {counts[0]} run steps but {counts[1]} run lengths")
                if codec == "row-runs" and (len(shape) < 2 or shape[-1] < 1):
                    _fail(f"{where}: row-runs of an array without rows")
        decode = _decoder(entry, spans, dtype, shape, size, where, section.body if deferred else lambda: body)
        out.append(_Deferred(shape, dtype, decode) if deferred else decode())
    return out


def _decoder(entry, spans, dtype, shape, size, where, buffer):
    """fn() -> the array an entry's checked parts (in buffer()) encode."""
    codec = entry["codec"]

    def decode() -> np.ndarray:
        data = buffer()
        arrays = [np.frombuffer(data[offset:offset + count * pdtype.itemsize], dtype=pdtype)
                  for pdtype, offset, count in spans]
        if codec in ("raw", "narrow"):
            return arrays[0].astype(dtype, copy=False).reshape(shape)
        if codec == "masked":
            bits, steps = arrays
            padding = np.unpackbits(bits, count=size).view(bool)
            if int(size - np.count_nonzero(padding)) != steps.size:
                _fail(f"{where}: {steps.size} indices for {size - np.count_nonzero(padding)} places")
            array = np.full(size, entry["fill"], dtype)
            array[~padding] = np.cumsum(steps.astype(dtype), dtype=dtype)
            return array.reshape(shape)
        steps, counts = arrays
        if counts.size and int(counts.min()) < 1 or int(counts.sum(dtype=np.int64)) != size:
            _fail(f"{where}: runs do not add up to {size} elements")
        # The steps, each repeated as often as its run says, summed in the
        # array's own type (every partial sum is one of its elements;
        # wrapping differences wrap back).
        array = np.repeat(steps.astype(dtype), counts)
        if codec == "runs":
            np.cumsum(array, out=array)
        else:
            array = array.reshape(-1, shape[-1])
            np.cumsum(array, axis=0, out=array)
        return array.reshape(shape)
    return decode


# ---------------------------------------------------------------- schema --
# Per class, its fields and what each holds: "int", "float" (int too),
# "str", "bool", "tensor", "array", "dtype", "view", "viewlike" (View or
# Concat), "seq" (a Sequence), "step" (a program step), "computeset",
# "kernel" (a graph.codelets* kernel), "instruction", "dimensions" (gather
# or scatter dimension numbers), "type" (ir.TensorType), "memory",
# "exchange", "operand" (a view or an immediate), "registered" (a
# (register, tensor) pair), "any" (plain data: numbers, strings, tuples,
# dicts, arrays, dtypes, objects here); "?x": x or None; "*x": a tuple of
# x; "[x": a list. The kernels' entries come from their records.

# A control step's own cost: its decisions (compiler.cost.cost_control).
_CONTROL_COST = {"cycles": "int", "exchange_bytes": "int", "exchange_cycles": "int", "sync_cycles": "int"}

_SCHEMA: dict[type, dict[str, str]] = {
    p.Sequence: {"steps": "[step"},
    p.Execute: {"compute_set": "computeset", "cycles": "int", "exchange_bytes": "int", "exchange_cycles": "int",
                "sync_cycles": "int"},
    p.Copy: {"src": "viewlike", "dst": "tensor", "cycles": "int", "exchange_bytes": "int",
             "exchange_cycles": "int", "sync_cycles": "int"},
    p.StreamingCopy: {"buffer": "view", "tile": "tensor", "starts": "any", "sizes": "*int", "store": "bool",
                      "name": "str", "cycles": "int"},
    p.Repeat: {"count": "int", "body": "seq", "name": "str", **_CONTROL_COST},
    p.RepeatWhileTrue: {"condition": "seq", "predicate": "tensor", "body": "seq", "name": "str", **_CONTROL_COST},
    p.If: {"predicate": "tensor", "then_body": "seq", "else_body": "seq", **_CONTROL_COST},
    p.Switch: {"control": "tensor", "cases": "any", "default": "seq", **_CONTROL_COST},
    p.Call: {"function": "seq", "name": "str"},
    p.HostToDevice: {"index": "int", "tensor": "tensor", "cycles": "int"},
    p.DeviceToHost: {"index": "int", "src": "view", "cycles": "int"},
    p.HostCall: {"callback_id": "int", "inputs": "[view", "outputs": "[tensor", "cycles": "int",
                 "host_bytes": "int", "partition": "?int"},
    View: {"tensor": "tensor", "ops": "any", "shape": "*int"},
    Concat: {"parts": "*view", "axis": "int"},
    DataDependentExchange: {"rounds": "int", "sent": "array", "received": "array", "buffers": "array"},
    MemoryReport: {"bytes_per_tile": "int", "always_live": "array", "not_always_live_peak": "array",
                   "code": "array", "argument_bytes": "int", "output_bytes": "int", "aliased_bytes": "int",
                   "temporary_bytes": "int", "liveness": "array", "liveness_exchange": "array",
                   "liveness_on_max_tile": "array", "live_at_peak": "*int", "streaming_bytes": "int",
                   "vertex_state": "array", "held_by_inputs": "*int", "peak_step": "int",
                   "live_at_peak_bytes": "*int", "max_tile_step": "int", "live_on_max_tile": "*int",
                   "live_on_max_tile_bytes": "*int", "exchange_on_max_tile": "array"},
    ir.TensorType: {"shape": "*int", "dtype": "dtype"},
    codelets.Instruction: {"op": "str", "args": "*int", "dtype": "dtype", "attrs": "any"},
    # Every kernel as its record declares it (graph/records.py).
    **{kind: record.schema() for kind, record in RECORDS.items()},
}
# Records of the IR whose objects kernels hold (dimension numbers of gathers
# and scatters), by name.
_LATE = {cls.__name__: cls for cls in (ir.GatherDimensionNumbers, ir.ScatterDimensionNumbers)}
_BY_NAME = {cls.__name__: cls for cls in _SCHEMA}
_STEPS = (p.Sequence, p.Execute, p.Copy, p.StreamingCopy, p.Repeat, p.RepeatWhileTrue, p.If, p.Switch, p.Call, p.HostToDevice,
          p.DeviceToHost, p.HostCall)
_KERNELS = tuple(RECORDS)
# The fields written by the vertex table, not the tree.
_COMPUTE_SET_FIELDS = {"name": "str", "kernel": "kernel", "exchange": "?exchange"}
# Values of string fields that select behaviour, as the kernels' records
# declare them: anything else is refused.
_CHOICES = {(kind, f.name): f.choices for kind, record in RECORDS.items() for f in record.fields if f.choices}


def _late_class(name: str):
    cls = _LATE[name]
    if not (dataclasses.is_dataclass(cls) and all(f.type in ("int", "tuple[int, ...]")
                                                  for f in dataclasses.fields(cls))):
        _fail(f"{name} is not a record of integers")
    return cls


# --------------------------------------------------------------- writing --

class _Encoder:
    def __init__(self, program: Program):
        self.program = program
        self.arrays = _Writer()
        self.ids: dict[int, int] = {}          # id(object) -> its reference number
        self.keep: list = []                   # the objects numbered (ids stay theirs)
        self.codelets: dict[str, int] = {}
        # The vertex table's columns, as chunks (a compute set's each).
        self.vertices = {k: [] for k in ("codelet", "tile", "cycles", "reads", "writes")}
        self.regions = {"tensor": [], "block": []}
        self.blocks: dict[int, int] = {}       # id(intervals array) -> block number
        # Block b: its block_lengths[b] intervals, repeated block_rows[b]
        # times, each time block_strides[b] further (a list: rows 1, stride 0).
        self.block_lengths: list[np.ndarray] = []
        self.block_rows: list[np.ndarray] = []
        self.block_strides: list[np.ndarray] = []
        self.block_intervals: list[np.ndarray] = []    # [k, 2] each
        self.num_blocks = 0
        self.num_vertices = 0

    def value(self, v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, float)) and type(v) in (int, float):
            return v if not (isinstance(v, float) and not np.isfinite(v)) else {"f": repr(v)}
        if isinstance(v, np.generic):
            return {"n": self.arrays.add(np.asarray(v))}
        if isinstance(v, np.ndarray):
            return {"a": self.arrays.add(v)}
        if isinstance(v, np.dtype):
            return {"dt": v.name}
        if isinstance(v, bytes):
            return {"b": self.arrays.add(np.frombuffer(v, np.uint8))}
        if isinstance(v, Tensor):
            if self.program.tensors[v.id] is not v:
                raise ProgramFormatError(f"{v} is not the program's tensor {v.id}")
            return {"T": v.id}
        if type(v) is tuple:
            return [self.value(x) for x in v]
        if type(v) is list:
            return {"L": [self.value(x) for x in v]}
        if type(v) is dict:
            return {"D": [[self.value(k), self.value(x)] for k, x in v.items()]}
        return self.obj(v)

    def obj(self, v):
        ref = self.ids.get(id(v))
        if ref is not None:
            return {"r": ref}
        cls = type(v)
        if isinstance(v, ComputeSet):
            cls, fields = ComputeSet, _COMPUTE_SET_FIELDS
        elif cls in _SCHEMA:
            fields = _SCHEMA[cls]
        elif cls.__name__ in _LATE:
            fields = {f.name: "any" for f in dataclasses.fields(v)}
        else:
            raise ProgramFormatError(f"cannot save a {cls.__module__}.{cls.__qualname__} ({v!r:.80})")
        self.ids[id(v)] = len(self.keep)
        self.keep.append(v)
        out = {"k": cls.__name__}
        for name in fields:
            out[name] = self.value(getattr(v, name))
        if cls is ComputeSet:
            out["vertices"] = [self.num_vertices, len(v.vertices)]
            self.add_vertices(v.vertices)
        return out

    def add_vertices(self, vertices) -> None:
        if isinstance(vertices, VertexArray):
            self.add_vertex_array(vertices)
            return
        table = {k: [] for k in self.vertices}
        tensor_ids, block_ids, lengths = [], [], []
        for vertex in vertices:
            table["codelet"].append(self.codelets.setdefault(vertex.codelet, len(self.codelets)))
            table["tile"].append(vertex.tile)
            table["cycles"].append(vertex.cycles)
            table["reads"].append(len(vertex.reads))
            table["writes"].append(len(vertex.writes))
            for region in vertex.reads + vertex.writes:
                self.check_tensor(region.tensor)
                block = self.blocks.get(id(region.intervals))
                if block is None:
                    block = self.blocks[id(region.intervals)] = self.num_blocks
                    self.num_blocks += 1
                    lengths.append(len(region.intervals))
                    self.block_intervals.append(np.asarray(region.intervals, np.int64).reshape(-1, 2))
                tensor_ids.append(region.tensor.id)
                block_ids.append(block)
        for k, column in table.items():
            self.vertices[k].append(np.asarray(column, np.int64))
        self.regions["tensor"].append(np.asarray(tensor_ids, np.int64))
        self.regions["block"].append(np.asarray(block_ids, np.int64))
        self.block_lengths.append(np.asarray(lengths, np.int64))
        self.block_rows.append(np.ones(len(lengths), np.int64))
        self.block_strides.append(np.zeros(len(lengths), np.int64))
        self.num_vertices += len(vertices)

    def add_vertex_array(self, vertices: VertexArray) -> None:
        """The columns the loop over its Vertex objects would give, from
        its arrays: each vertex's regions are its reads' then its writes'
        parts, each interval slice a block of its own (a large program has
        millions of such vertices: one at a time, saving took seconds), a
        RowIntervals part's slice as its runs repeated over its rows."""
        count = len(vertices)
        parts = []            # (tensor, intervals, offsets [v + 1], rows [v], strides [v])
        for tensor, intervals, offsets in vertices.reads + vertices.writes:
            self.check_tensor(tensor)
            if isinstance(intervals, RowIntervals):
                parts.append((tensor, np.stack([intervals.starts, intervals.stops], axis=1), intervals.runs,
                              intervals.count, intervals.stride))
            else:
                parts.append((tensor, *csr_part(intervals, offsets), np.ones(count, np.int64),
                              np.zeros(count, np.int64)))
        if not count:        # (its codelet is not named, as the loop would not name it)
            return
        code = self.codelets.setdefault(vertices.codelet, len(self.codelets))
        table = self.vertices
        table["codelet"].append(np.full(count, code, np.int64))
        table["tile"].append(np.asarray(vertices.tiles, np.int64))
        table["cycles"].append(np.asarray(vertices.cycles, np.int64))
        table["reads"].append(np.full(count, len(vertices.reads), np.int64))
        table["writes"].append(np.full(count, len(vertices.writes), np.int64))
        self.regions["tensor"].append(np.tile(np.asarray([part[0].id for part in parts], np.int64), count))
        self.regions["block"].append(self.num_blocks + np.arange(count * len(parts), dtype=np.int64))
        self.num_blocks += count * len(parts)
        offsets = [np.asarray(part[2], np.int64) for part in parts]

        def by_vertex(columns: list) -> np.ndarray:
            """Per vertex, per part (the blocks' order)."""
            return (np.stack(columns, axis=1) if parts else np.zeros((count, 0), np.int64)).reshape(-1)
        lengths = by_vertex([np.diff(off) for off in offsets]).reshape(count, len(parts))
        self.block_lengths.append(lengths.reshape(-1))
        self.block_rows.append(by_vertex([np.asarray(part[3], np.int64) for part in parts]))
        self.block_strides.append(by_vertex([np.asarray(part[4], np.int64) for part in parts]))
        if len(parts) == 1:
            (_, intervals, off, _, _), = parts
            self.block_intervals.append(np.asarray(intervals[off[0]:off[-1]], np.int64).reshape(-1, 2))
        elif parts:
            # Vertex by vertex, part by part: where each part's run of
            # intervals for a vertex goes among all of them.
            firsts = (np.cumsum(lengths.reshape(-1)) - lengths.reshape(-1)).reshape(count, len(parts))
            out = np.empty((int(lengths.sum()), 2), np.int64)
            for j, ((_, intervals, _, _, _), off) in enumerate(zip(parts, offsets, strict=True)):
                owner = np.repeat(np.arange(count), lengths[:, j])
                places = firsts[owner, j] + np.arange(len(owner)) - (off[owner] - off[0])
                out[places] = np.asarray(intervals[off[0]:off[-1]], np.int64).reshape(-1, 2)
            self.block_intervals.append(out)
        self.num_vertices += count

    def check_tensor(self, tensor: Tensor) -> None:
        if self.program.tensors[tensor.id] is not tensor:
            raise ProgramFormatError(f"a vertex reads or writes {tensor}, not the program's")

    def tensors(self) -> dict:
        meta, runs, tiles, starts = [], [], [], []
        for t in self.program.tensors:
            m = t.mapping
            meta.append([t.name, t.dtype.name, list(t.shape),
                         None if t.constant is None else self.arrays.add(t.constant), bool(t.streaming)])
            runs.append(len(m.tiles))
            tiles.append(m.tiles)
            starts.append(m.starts)
            if len(m.stops) and (np.any(m.stops[:-1] != m.starts[1:]) or m.stops[-1] != m.size):
                raise ProgramFormatError(f"{t}: its mapping's intervals do not touch")
            if m.size != t.size:
                raise ProgramFormatError(f"{t} has a mapping of {m.size} elements")
        # The mappings are deferred: running never reads them.
        return {"meta": meta, "runs": self.arrays.add(np.asarray(runs, np.int64)),
                "tiles": self.arrays.add(np.concatenate(tiles, dtype=np.int64) if tiles else np.zeros(0, np.int64),
                                         True),
                "starts": self.arrays.add(np.concatenate(starts, dtype=np.int64) if starts else np.zeros(0, np.int64),
                                          True)}

    def vertex_table(self) -> dict:
        """The vertices of all compute sets as columns, deferred but for
        their tiles (the program's summary lists each compute set's)."""
        def add(values):
            return self.arrays.add(values, True)

        def joined(chunks: list, shape=(0,)) -> np.ndarray:
            return np.concatenate(chunks) if chunks else np.zeros(shape, np.int64)
        flat = joined(self.block_intervals, (0, 2))
        return {"codelets": list(self.codelets),
                **{k: add(joined(v)) for k, v in self.vertices.items() if k != "tile"},
                "tile": self.arrays.add(joined(self.vertices["tile"])),
                "region_tensor": add(joined(self.regions["tensor"])),
                "region_block": add(joined(self.regions["block"])),
                "block_lengths": add(joined(self.block_lengths)),
                "block_rows": add(joined(self.block_rows)), "block_strides": add(joined(self.block_strides)),
                "block_starts": add(flat[:, 0].copy()), "block_stops": add(flat[:, 1].copy())}


def dumps(program: Program, meta: dict | None = None) -> bytes:
    """The program (and `meta`, plain data the caller keeps with it) as bytes."""
    enc = _Encoder(program)
    header = {
        "format": FORMAT_VERSION,
        "plugin": plugin_version(),
        "tensors": enc.tensors(),
        "program": {
            "name": program.name, "target_name": program.target_name, "num_tiles": program.num_tiles,
            "body": enc.value(program.body),
            "inputs": [t.id for t in program.inputs],
            "outputs": [enc.value(v) for v in program.outputs],
            "input_types": [enc.value(t) for t in program.input_types],
            "output_types": [enc.value(t) for t in program.output_types],
            "aliases": [[int(k), int(v)] for k, v in program.aliases.items()],
            "in_place": [[int(k), int(v)] for k, v in program.in_place.items()],
            "cycles": int(program.cycles), "unknown_trip_loops": enc.value(program.unknown_trip_loops),
            "host_cycles": int(program.host_cycles), "memory": enc.value(program.memory),
            "flops": float(program.flops), "shardings": enc.value(program.shardings),
            "bytes_accessed": float(program.bytes_accessed), "transcendentals": float(program.transcendentals),
            "token_outputs": [int(i) for i in program.token_outputs],
            "streaming_inputs": [int(i) for i in program.streaming_inputs],
            "streaming_outputs": [int(i) for i in program.streaming_outputs],
            "input_layouts": [None if x is None else [int(d) for d in x] for x in program.input_layouts],
            "output_layouts": [None if x is None else [int(d) for d in x] for x in program.output_layouts],
            "emulated": [[str(e["op"]), int(e["count"]), int(e["cycles"])] for e in program.emulated],
        },
        "meta": enc.value(meta or {}),
    }
    header["vertices"] = enc.vertex_table()
    header["arrays"] = enc.arrays.table
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    pad = -len(text) % _ALIGN
    # Level 1: the runs still repeat (image rows, tiles), and it inflates
    # fast (docs/performance.md). Compressed part by part, never joined;
    # the deferred section as a stream of its own, inflated when first read.
    body, deferred = enc.arrays.parts
    packed = _deflate([text + b" " * pad] + body)
    packed_size = sum(len(chunk) for chunk in packed)
    packed += _deflate(deferred)
    packed = b"".join(packed)
    body_size = len(text) + pad + enc.arrays.sizes[0]
    return PREFIX.pack(MAGIC, FORMAT_VERSION, len(text) + pad, body_size, packed_size, enc.arrays.sizes[1],
                        hashlib.sha256(packed).digest()) + packed


def _deflate(parts: list) -> list[bytes]:
    deflate = zlib.compressobj(1)
    return [deflate.compress(part) for part in parts] + [deflate.flush()]


# --------------------------------------------------------------- reading --

class LoadedComputeSet(ComputeSet):
    """A compute set read from bytes: its vertices are built from the
    vertex table when first read. The engine never reads them (it runs the
    kernel); profiles and checks do, and building a large program's
    hundreds of thousands of vertex objects would take seconds of a load.
    Their count and tiles come from the table without building them (the
    summary that compiled.as_text() and PJRT's layouts read lists both)."""

    def __init__(self, name: str, table, kernel, exchange=None):
        self.name, self.kernel, self.exchange = name, kernel, exchange
        self._table, self._vertices = table, None

    @property
    def vertices(self):
        if self._vertices is None:
            self._vertices = _LazyVertices(self._table)
        return self._vertices

    @vertices.setter
    def vertices(self, value) -> None:
        self._vertices = value

    def tiles(self) -> np.ndarray:
        if isinstance(self._vertices, list):
            return super().tiles()
        return self._table.tiles()


class _LazyVertices(collections.abc.Sequence):
    """A compute set's vertices, built on first use but for their count."""

    def __init__(self, table):
        self._table, self._built = table, None

    def __len__(self) -> int:
        return self._table.count

    def _list(self) -> list:
        if self._built is None:
            self._built = self._table.build()
        return self._built

    def __getitem__(self, i):
        return self._list()[i]

    def __iter__(self):
        return iter(self._list())


# What each field spec of _SCHEMA accepts (Decoder.check).
_CHECKS = {"int": lambda y: type(y) is int, "float": lambda y: type(y) in (int, float),
           "str": lambda y: type(y) is str, "bool": lambda y: type(y) is bool,
           "tensor": lambda y: type(y) is Tensor, "array": lambda y: type(y) is np.ndarray,
           "dtype": lambda y: isinstance(y, np.dtype), "view": lambda y: type(y) is View,
           "viewlike": lambda y: type(y) in (View, Concat), "seq": lambda y: type(y) is p.Sequence,
           "step": lambda y: type(y) in _STEPS, "kernel": lambda y: type(y) in _KERNELS,
           "instruction": lambda y: type(y) is codelets.Instruction,
           "computeset": lambda y: type(y) is LoadedComputeSet,
           "dimensions": lambda y: type(y).__name__ in _LATE, "type": lambda y: type(y) is ir.TensorType,
           "memory": lambda y: type(y) is MemoryReport, "exchange": lambda y: type(y) is DataDependentExchange,
           "operand": lambda y: type(y) is View or is_immediate(y),
           "registered": lambda y: type(y) is tuple and len(y) == 2 and type(y[0]) is int and type(y[1]) is Tensor,
           "any": lambda y: True}


def _accepts(spec: str):
    """fn(x) -> whether x is what a field spec says (None: anything); a
    field that fails goes through _Decoder.check for the message."""
    if spec == "any":
        return None
    if spec[0] == "?":
        inner = _accepts(spec[1:])
        return lambda x: x is None or inner(x)
    if spec[0] in "*[":
        kind = tuple if spec[0] == "*" else list
        inner = _accepts(spec[1:])
        if inner is None:
            return lambda x: type(x) is kind
        return lambda x: type(x) is kind and all(map(inner, x))
    return _CHECKS[spec]


def _kind(name: str, cls, fields: dict) -> tuple:
    """What decoding an object of one kind needs, worked out once: its
    class, the keys its dict holds, per field (name, where suffix, test,
    spec), and its checked string choices."""
    keys = frozenset(fields) | {"k"} | ({"vertices"} if name == "ComputeSet" else set())
    return (cls, keys, tuple((f, "." + f, _accepts(spec), spec) for f, spec in fields.items()),
            " > " + name, {f: c for (k, f), c in _CHOICES.items() if k is cls})


_KINDS = {cls.__name__: _kind(cls.__name__, cls, fields) for cls, fields in _SCHEMA.items()}
_KINDS["ComputeSet"] = _kind("ComputeSet", LoadedComputeSet, _COMPUTE_SET_FIELDS)
_PLAIN = frozenset((type(None), bool, int, float, str))


def _at(where) -> str:
    """A decoder's place, kept as (place, suffix) pairs while all goes
    well, as text for a message."""
    parts = []
    while type(where) is tuple:
        where, suffix = where
        parts.append(suffix)
    parts.append(where)
    return "".join(reversed(parts))


class _Decoder:
    def __init__(self, arrays: list[np.ndarray], tensors: list[Tensor], vertices: dict):
        self.arrays = arrays
        self.tensors = tensors
        self.vertices = vertices
        self.refs: list = []

    def array(self, i, where) -> np.ndarray:
        if type(i) is not int or not 0 <= i < len(self.arrays):
            _fail(f"{_at(where)}: array {i!r} out of range")
        return _resolved(self.arrays[i])

    def tensor(self, i, where) -> Tensor:
        if type(i) is not int or not 0 <= i < len(self.tensors):
            _fail(f"{_at(where)}: tensor {i!r} out of range")
        return self.tensors[i]

    def value(self, v, where):
        t = type(v)
        if t in _PLAIN:
            return v
        if t is list:        # plain elements (shapes, registers) without a call each
            value = self.value
            return tuple([x if type(x) in _PLAIN else value(x, where) for x in v])
        if t is not dict or len(v) != 1 and "k" not in v:
            _fail(f"{_at(where)}: malformed value")
        if "k" in v:
            return self.obj(v, where)
        (tag, x), = v.items()
        if tag == "T":
            return self.tensor(x, where)
        if tag == "r":
            if type(x) is not int or not 0 <= x < len(self.refs) or self.refs[x] is None:
                _fail(f"{_at(where)}: reference {x!r} to no earlier object")
            return self.refs[x]
        if tag == "dt":
            return _dtype(x, where)
        if tag == "a":
            return self.array(x, where)
        if tag == "n":
            array = self.array(x, where)
            if array.ndim:
                _fail(f"{_at(where)}: a scalar that is not 0-d")
            return array[()]
        if tag == "b":
            array = self.array(x, where)
            if array.dtype != np.uint8:
                _fail(f"{_at(where)}: bytes not held as uint8")
            return array.tobytes()
        if tag == "f":
            if x not in ("inf", "-inf", "nan"):
                _fail(f"{_at(where)}: bad float {x!r}")
            return float(x)
        if tag == "L" and type(x) is list:
            return [self.value(y, where) for y in x]
        if tag == "D" and type(x) is list:
            out = {}
            for pair in x:
                if type(pair) is not list or len(pair) != 2:
                    _fail(f"{_at(where)}: malformed dict entry")
                key = self.value(pair[0], where)
                try:
                    out[key] = self.value(pair[1], where)
                except TypeError:
                    _fail(f"{_at(where)}: dict key of type {type(key).__name__}")
            return out
        _fail(f"{_at(where)}: unknown value tag {tag!r}")

    def obj(self, v: dict, where):
        name = v.get("k")
        kind = _KINDS.get(name) if type(name) is str else None
        if kind is None:
            if type(name) is not str:
                _fail(f"{_at(where)}: object kind {name!r:.40}")
            if name not in _LATE:
                _fail(f"{_at(where)}: unknown object kind {name!r}")
            cls = _late_class(name)
            kind = _kind(name, cls, {f.name: "any" for f in dataclasses.fields(cls)})
        cls, keys, fields, suffix, choices = kind
        where = (where, suffix)
        slot = len(self.refs)
        self.refs.append(None)          # numbered before its parts, as written
        if v.keys() != keys:
            _fail(f"{_at(where)}: fields {sorted(set(v) - {'k'})}, expected {sorted(keys - {'k'})}")
        values = {}
        value = self.value
        for f, dot, test, spec in fields:
            x = v[f]
            if type(x) not in _PLAIN:
                x = value(x, (where, dot))
            if test is not None and not test(x):
                self.check(spec, x, _at((where, dot)))
            values[f] = x
        if cls is LoadedComputeSet:
            result = LoadedComputeSet(values["name"], self.compute_set_vertices(v["vertices"], where),
                                      values["kernel"], values["exchange"])
        elif name in _LATE:
            for f, x in values.items():
                ok = type(x) is int or type(x) is tuple and all(type(y) is int for y in x)
                if not ok:
                    _fail(f"{_at(where)}.{f}: expected integers")
            result = cls(**values)
        else:
            for f, allowed in choices.items():
                if values[f] is not None and values[f] not in allowed:
                    _fail(f"{_at(where)}.{f}: {values[f]!r} is not one of {allowed}")
            if cls is View:
                _check_view(values["tensor"], values["ops"], values["shape"], where)
            elif cls is p.Switch and not (type(values["cases"]) is dict and all(
                    type(k) is int and type(s) is p.Sequence for k, s in values["cases"].items())):
                _fail(f"{_at(where)}.cases: not a dict of integers to sequences")
            result = cls(**values)
        self.refs[slot] = result
        return result

    def check(self, spec: str, x, where: str):
        if spec.startswith("?"):
            return None if x is None else self.check(spec[1:], x, where)
        if spec[0] in "*[":
            kind = tuple if spec[0] == "*" else list
            if type(x) is not kind:
                _fail(f"{where}: expected a {kind.__name__}, got {type(x).__name__}")
            for y in x:
                self.check(spec[1:], y, where)
            return x
        ok = _CHECKS[spec]
        if not ok(x):
            _fail(f"{where}: expected {spec}, got {type(x).__name__}")
        return x

    def compute_set_vertices(self, span, where) -> list:
        if type(span) is not list or len(span) != 2 or type(span[0]) is not int or type(span[1]) is not int:
            _fail(f"{_at(where)}: malformed vertex span")
        first, count = span
        table = self.vertices
        if first < 0 or count < 0 or first + count > table["count"]:
            _fail(f"{_at(where)}: vertices {first}..{first + count} out of the table")
        return _VertexSpan(table, first, count)


class _VertexSpan:
    """Vertices first..first+count of the vertex table."""

    def __init__(self, table: dict, first: int, count: int):
        self._table, self._first, self.count = table, first, count

    def build(self) -> list:
        return self._table["build"](self._first, self.count)

    def tiles(self) -> np.ndarray:
        # The tiles as np.unique gives them, without its sort or hash: the
        # summary asks for every compute set's at load. (Checked at load:
        # no tile is negative.)
        return np.flatnonzero(np.bincount(self._table["tile"][self._first:self._first + self.count]))


def _ints(t) -> bool:
    return type(t) is tuple and all(type(i) is int for i in t)


def _check_view(tensor: Tensor, ops, shape, where) -> None:
    """The view's ops are well-formed and give its shape."""
    if type(ops) is not tuple:
        _fail(f"{_at(where)}: ops are not a tuple")
    current = tuple(tensor.shape)
    for op in ops:
        if type(op) is not tuple or not op or op[0] not in _SHAPE:
            _fail(f"{_at(where)}: unknown view op {op!r:.60}")
        kind, args = op[0], op[1:]
        size = math.prod(current)
        if kind == "reshape" and not (len(args) == 1 and _ints(args[0]) and all(d >= 0 for d in args[0])
                                      and math.prod(args[0]) == size):
            _fail(f"{_at(where)}: reshape {args!r:.60} of {current}")
        if kind == "transpose" and not (len(args) == 1 and _ints(args[0])
                                        and sorted(args[0]) == list(range(len(current)))):
            _fail(f"{_at(where)}: transpose {args!r:.60} of {current}")
        if kind == "slice" and not (len(args) == 3 and all(_ints(a) and len(a) == len(current) for a in args)
                                    and all(0 <= a <= b <= d and c > 0 for a, b, c, d in zip(*args, current, strict=True))):
            _fail(f"{_at(where)}: slice {args!r:.60} of {current}")
        if kind == "broadcast":
            if not (len(args) == 2 and _ints(args[0]) and _ints(args[1]) and len(args[1]) == len(current)
                    and all(0 <= d < len(args[0]) for d in args[1])
                    and all(n in (1, args[0][d]) for n, d in zip(current, args[1], strict=True))):
                _fail(f"{_at(where)}: broadcast {args!r:.60} of {current}")
        if kind == "gather":
            if not (len(args) == 2 and type(args[0]) is np.ndarray and args[0].dtype in (np.int32, np.intp)):
                _fail(f"{_at(where)}: gather without integer indices")
            indices, fill = args
            if indices.size and (int(indices.min()) < 0 or int(indices.max()) > size
                                 or int(indices.max()) == size and fill is None):
                _fail(f"{_at(where)}: gather indices out of 0..{size}")
            if fill is not None and not (isinstance(fill, np.generic) or type(fill) in (bool, int, float)
                                         or type(fill) is np.ndarray and fill.ndim == 0):
                _fail(f"{_at(where)}: gather fill is not a scalar")
        if kind == "windows":
            spec = args[0] if len(args) == 2 else None
            if not (type(spec) is tuple and 0 < len(spec) <= len(current)
                    and all(type(a) is tuple and len(a) == 7 and all(type(i) is int for i in a)
                            and min(a[0], a[1], a[4], a[5]) >= 1 and a[6] in (0, 1)
                            and max(abs(a[2]), abs(a[3]), *a[:2], *a[4:6]) < 1 << 31 for a in spec)):
                _fail(f"{_at(where)}: windows {args!r:.60} of {current}")
            fill = args[1]
            if fill is not None and not (isinstance(fill, np.generic) or type(fill) is np.ndarray and fill.ndim == 0):
                _fail(f"{_at(where)}: windows fill is not a scalar")
        current = _SHAPE[kind](current, *args)
    if current != shape:
        _fail(f"{_at(where)}: ops give shape {current}, the view says {shape}")


def _vertex_builder(header, arrays, tensors, where="vertices"):
    """Reads the vertex table: its count, its tile column (compute sets'
    tiles, read at load for the program's summary), and a function
    building vertices first..first+count. The other columns are deferred:
    their lengths are checked now, their values when vertices are first built."""
    if type(header) is not dict:
        _fail(f"{where}: not a table")
    keys = ("codelet", "tile", "cycles", "reads", "writes", "region_tensor", "region_block", "block_lengths",
            "block_rows", "block_strides", "block_starts", "block_stops")
    if set(header) != set(keys) | {"codelets"}:
        _fail(f"{where}: fields {sorted(header)}")
    names = header["codelets"]
    if type(names) is not list or not all(type(n) is str for n in names):
        _fail(f"{where}: codelet names are not strings")
    cols = {}
    for k in keys:
        i = header[k]
        if type(i) is not int or not 0 <= i < len(arrays) or arrays[i].ndim != 1 or arrays[i].dtype.kind not in "iu":
            _fail(f"{where}.{k}: not an integer column")
        cols[k] = arrays[i]
    tile = _resolved(cols["tile"]).astype(np.int64, copy=False)
    n = len(tile)
    if any(len(cols[k]) != n for k in ("codelet", "cycles", "reads", "writes")) \
            or len(cols["region_tensor"]) != len(cols["region_block"]) \
            or len(cols["block_starts"]) != len(cols["block_stops"]) \
            or not len(cols["block_lengths"]) == len(cols["block_rows"]) == len(cols["block_strides"]):
        _fail(f"{where}: columns of different lengths")
    if n and int(tile.min()) < 0:
        _fail(f"{where}: a vertex on a negative tile")
    table: dict = {}

    def columns() -> dict:
        """The table's columns, decoded and checked when vertices are first built."""
        if not table:
            c = {k: _resolved(v) for k, v in cols.items()}
            if n and (int(c["codelet"].min()) < 0 or int(c["codelet"].max()) >= len(names)
                      or int(c["reads"].min()) < 0 or int(c["writes"].min()) < 0):
                _fail(f"{where}: a codelet or region count out of range")
            region_ends = np.cumsum(c["reads"].astype(np.int64) + c["writes"])
            num_regions = int(region_ends[-1]) if n else 0
            if len(c["region_tensor"]) != num_regions:
                _fail(f"{where}: {num_regions} regions expected")
            lengths = c["block_lengths"]
            if len(lengths) and int(lengths.min()) < 0:
                _fail(f"{where}: negative interval count")
            block_ends = np.cumsum(lengths.astype(np.int64))
            if len(c["block_starts"]) != (int(block_ends[-1]) if len(lengths) else 0):
                _fail(f"{where}: interval columns do not match the blocks")
            tensor, block = c["region_tensor"], c["region_block"]
            if num_regions and (int(tensor.min()) < 0 or int(tensor.max()) >= len(tensors)
                                or int(block.min()) < 0 or int(block.max()) >= len(lengths)):
                _fail(f"{where}: a region refers to no tensor or interval block")
            c["region_starts"] = np.concatenate(([0], region_ends))
            c["block_cuts"] = np.concatenate(([0], block_ends))
            _check_blocks(c, tensor, block, tensors, where)
            table.update(c)
        return table
    blocks: dict = {}
    pairs = []

    def block(b: int) -> np.ndarray:
        found = blocks.get(b)
        if found is None:
            if not pairs:
                pairs.append(np.stack([table["block_starts"], table["block_stops"]], axis=1).astype(np.int64))
            cuts = table["block_cuts"]
            found = pairs[0][int(cuts[b]):int(cuts[b + 1])]
            rows, stride = int(table["block_rows"][b]), int(table["block_strides"][b])
            if rows != 1:       # (checked: within the tensors of the regions naming it)
                found = (found[None] + (np.arange(rows, dtype=np.int64) * stride)[:, None, None]).reshape(-1, 2)
            blocks[b] = found
        return found

    def build(first: int, count: int) -> list:
        """Vertices first..first+count (regions sharing interval arrays as
        the compiler's did)."""
        c = columns()
        span = slice(first, first + count)
        codelet_names = [names[i] for i in c["codelet"][span].tolist()]
        tiles, cycles = c["tile"][span].tolist(), c["cycles"][span].tolist()
        reads, writes = c["reads"][span].tolist(), c["writes"][span].tolist()
        r0, r1 = (int(c["region_starts"][first]), int(c["region_starts"][first + count])) if count else (0, 0)
        region_tensor, region_block = c["region_tensor"][r0:r1].tolist(), c["region_block"][r0:r1].tolist()
        out, r = [], 0
        for v in range(count):
            k = reads[v] + writes[v]
            regions = tuple(Region(tensors[region_tensor[j]], block(region_block[j])) for j in range(r, r + k))
            r += k
            out.append(Vertex(codelet_names[v], tiles[v], regions[:reads[v]], regions[reads[v]:], cycles[v]))
        return out
    return {"count": n, "build": build, "tile": tile}


def _check_blocks(c: dict, region_tensor: np.ndarray, region_block: np.ndarray, tensors: list, where: str) -> None:
    """Each interval block, its rows listed, lies within the tensor of every
    region naming it: starts >= 0, stops >= starts, rows >= 1, strides >= 0,
    the last row's stops <= the tensor's size; and a block of several rows
    has no empty interval and rows that do not overlap (its stride at least
    its span), so that listing it gives at most its tensor's elements."""
    starts, stops = c["block_starts"].astype(np.int64), c["block_stops"].astype(np.int64)
    rows, strides, lengths = c["block_rows"], c["block_strides"], c["block_lengths"].astype(np.int64)
    if len(starts) and (int(starts.min()) < 0 or bool((stops < starts).any())):
        _fail(f"{where}: an interval that starts below 0 or ends before it starts")
    if len(rows) and (int(rows.min()) < 1 or int(strides.min()) < 0):
        _fail(f"{where}: an interval block of fewer than one row or a negative stride")
    if not len(region_block):
        return
    top = np.zeros(len(lengths), np.float64)           # each block's largest stop, its rows listed
    filled = np.flatnonzero(lengths)
    if len(filled):
        firsts = c["block_cuts"][:-1][filled]
        top[filled] = np.maximum.reduceat(stops, firsts)
        several = rows[filled] > 1
        span = top[filled] - np.minimum.reduceat(starts, firsts)
        empty = np.add.reduceat((stops == starts).astype(np.int64), firsts)
        if bool((several & ((empty > 0) | (strides[filled] < span))).any()):
            _fail(f"{where}: an interval block of several rows with an empty interval or overlapping rows")
    top += (rows.astype(np.float64) - 1) * strides.astype(np.float64)
    sizes = np.array([float(t.size) for t in tensors], np.float64)
    beyond = np.flatnonzero(top[region_block] > sizes[region_tensor])
    if len(beyond):
        j = int(beyond[0])
        _fail(f"{where}: interval block {int(region_block[j])} reaches beyond the "
              f"{int(sizes[region_tensor[j]])} elements of tensor {int(region_tensor[j])}")


class _MappingColumns:
    """The tensors' mapping columns (tiles and starts of every run,
    millions in a large program), decoded when a mapping is first read:
    running a loaded program reads none (profiles and reports do)."""

    def __init__(self, tiles, starts):
        self._tiles, self._starts, self.pair = tiles, starts, None
        self.num_tiles = 0        # the program's, set once it is read

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        if self.pair is None:
            self.pair = (_resolved(self._tiles).astype(np.int64), _resolved(self._starts).astype(np.int64))
        return self.pair


class _LoadedMapping(TileMapping):
    """A loaded tensor's TileMapping, decoded and checked on first use."""

    __slots__ = ("_columns", "_span", "_where", "_runs")

    def __init__(self, size: int, columns: _MappingColumns, first: int, last: int, where: str):
        self.size, self._columns, self._span, self._where = size, columns, (first, last), where
        self._runs, self._element_tiles, self._by_tile, self._per_tile = None, None, None, None

    def _decoded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._runs is None:
            all_tiles, all_starts = self._columns.get()
            first, last = self._span
            tiles, starts, size = all_tiles[first:last], all_starts[first:last], self.size
            if len(starts) and (starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= size
                                or int(tiles.min()) < 0):
                _fail(f"{self._where}: its mapping is not ascending runs over its {size} elements")
            if len(tiles) and int(tiles.max()) >= self._columns.num_tiles:
                _fail(f"{self._where}: mapped to a tile beyond {self._columns.num_tiles}")
            self._runs = (tiles, starts, np.append(starts[1:], size) if len(starts) else starts)
        return self._runs

    tiles = property(lambda self: self._decoded()[0])
    starts = property(lambda self: self._decoded()[1])
    stops = property(lambda self: self._decoded()[2])


def _tensors(header, arrays) -> list[Tensor]:
    if type(header) is not dict or set(header) != {"meta", "runs", "tiles", "starts"}:
        _fail("tensors: malformed table")
    meta = header["meta"]
    cols = {}
    for k in ("runs", "tiles", "starts"):
        i = header[k]
        if type(i) is not int or not 0 <= i < len(arrays) or arrays[i].ndim != 1 or arrays[i].dtype.kind not in "iu":
            _fail(f"tensors.{k}: not an integer column")
        cols[k] = arrays[i] if k != "runs" else _resolved(arrays[i]).astype(np.int64)
    if type(meta) is not list or len(meta) != len(cols["runs"]):
        _fail("tensors: one entry per tensor expected")
    if len(cols["runs"]) and int(cols["runs"].min()) < 0:
        _fail("tensors: negative run count")
    ends = np.cumsum(cols["runs"])
    if len(cols["tiles"]) != len(cols["starts"]) or len(cols["tiles"]) != (int(ends[-1]) if len(ends) else 0):
        _fail("tensors: mapping columns do not match the run counts")
    cuts = np.concatenate(([0], ends)).tolist()
    columns = _MappingColumns(cols["tiles"], cols["starts"])
    tensors = []
    for i, entry in enumerate(meta):
        where = f"tensor {i}"
        if type(entry) is not list or len(entry) != 5 or type(entry[0]) is not str or type(entry[4]) is not bool \
                or type(entry[2]) is not list or not all(type(d) is int and d >= 0 for d in entry[2]):
            _fail(f"{where}: malformed entry")
        name, dtype, shape, constant = entry[0], _dtype(entry[1], where), tuple(entry[2]), entry[3]
        size = math.prod(shape)
        if size and cuts[i] == cuts[i + 1]:
            _fail(f"{where}: its {size} elements are not mapped")
        mapping = _LoadedMapping(size, columns, cuts[i], cuts[i + 1], where)
        if constant is not None:
            if type(constant) is not int or not 0 <= constant < len(arrays):
                _fail(f"{where}: constant {constant!r} out of range")
            constant = _resolved(arrays[constant])
            if constant.shape != shape or constant.dtype != dtype:
                _fail(f"{where}: constant of {constant.dtype}{list(constant.shape)}, not {dtype}{list(shape)}")
        tensors.append(Tensor(i, name, shape, dtype, mapping, constant, streaming=entry[4]))
    return tensors


def loads(data: bytes) -> tuple[Program, dict]:
    """(program, meta) from bytes written by dumps; ProgramFormatError if
    they are not such bytes, or were written by another jax-ipu. The
    deferred section is inflated and checked when first read."""
    with gc_pause.paused():    # 10^5 objects, no cycles (see gc_pause)
        return _loads(data)


def _loads(data: bytes) -> tuple[Program, dict]:
    data = memoryview(data)
    if len(data) < _MARK.size:
        _fail(f"{len(data)} bytes are too few")
    magic, version = _MARK.unpack_from(data)
    if magic != MAGIC:
        _fail("it does not start with the jax-ipu program mark")
    if version != FORMAT_VERSION:
        _fail(f"program format {version}, this jax-ipu reads format {FORMAT_VERSION}")
    if len(data) < PREFIX.size:
        _fail(f"{len(data)} bytes are too few")
    _, _, header_size, body_size, packed_size, deferred_size, digest = PREFIX.unpack_from(data)
    packed = data[PREFIX.size:]
    # Over both sections: a truncated or corrupted entry is refused here,
    # not when its deferred section is first read.
    if hashlib.sha256(packed).digest() != digest:
        _fail("its checksum does not match (truncated or corrupted)")
    if packed_size > len(packed):
        _fail("its body runs past the end")
    body = _inflate(packed[:packed_size], body_size, "its body")
    section = _Section(packed[packed_size:], deferred_size)
    if header_size > len(body):
        _fail("the header runs past the end")
    try:
        header = json.loads(bytes(body[:header_size]))
    except (ValueError, UnicodeDecodeError) as exc:
        _fail(f"unreadable header ({exc})")
    if type(header) is not dict:
        _fail("the header is not an object")
    expected = {"format", "plugin", "tensors", "program", "meta", "vertices", "arrays"}
    if set(header) != expected:
        _fail(f"header fields {sorted(header)}, expected {sorted(expected)}")
    if header["plugin"] != plugin_version():
        _fail(f"saved by jax-ipu {header['plugin']}, this is jax-ipu {plugin_version()}; compile it again")
    arrays = _read_arrays(header["arrays"], body[header_size:], section)
    tensors = _tensors(header["tensors"], arrays)
    dec = _Decoder(arrays, tensors, _vertex_builder(header["vertices"], arrays, tensors))
    program = _program(header["program"], dec, tensors)
    meta = dec.value(header["meta"], "meta")
    if type(meta) is not dict:
        _fail("meta is not a dict")
    return program, meta


def _program(h, dec: _Decoder, tensors: list[Tensor]) -> Program:
    fields = {"name": "str", "target_name": "str", "num_tiles": "int", "body": "seq", "inputs": None,
              "outputs": None, "input_types": "*type", "output_types": "*type", "aliases": None, "in_place": None,
              "cycles": "int", "unknown_trip_loops": "[any", "host_cycles": "int", "memory": "?memory",
              "flops": "float", "shardings": "any", "bytes_accessed": "float", "transcendentals": "float",
              "token_outputs": None, "streaming_inputs": None, "streaming_outputs": None,
              "input_layouts": None, "output_layouts": None, "emulated": None}
    if type(h) is not dict or set(h) != set(fields):
        _fail("program: malformed")
    values = {}
    for f, spec in fields.items():
        if spec is not None:
            values[f] = dec.check(spec, dec.value(h[f], f"program.{f}"), f"program.{f}")
    values["inputs"] = [dec.tensor(i, "program.inputs") for i in _int_list(h["inputs"], "program.inputs")]
    if type(h["outputs"]) is not list:
        _fail("program.outputs: not a list")
    values["outputs"] = [dec.check("view", dec.value(v, "program.outputs"), "program.outputs") for v in h["outputs"]]
    values["input_types"] = list(values["input_types"])
    values["output_types"] = list(values["output_types"])
    for f in ("input_types", "output_types"):
        if not all(type(t) is ir.TensorType for t in values[f]):
            _fail(f"program.{f}: not tensor types")
    for f, count_from, count_to in (("aliases", "outputs", "inputs"), ("in_place", "outputs", "inputs")):
        pairs = h[f]
        if type(pairs) is not list or not all(type(x) is list and len(x) == 2 for x in pairs):
            _fail(f"program.{f}: malformed")
        values[f] = {}
        for o, i in pairs:
            if type(o) is not int or type(i) is not int or not 0 <= o < len(values[count_from]) \
                    or not 0 <= i < len(values[count_to]):
                _fail(f"program.{f}: pair ({o!r}, {i!r}) out of range")
            values[f][o] = i
    for f in ("token_outputs", "streaming_inputs", "streaming_outputs"):
        values[f] = tuple(_int_list(h[f], f"program.{f}"))
    rows = h["emulated"]
    if type(rows) is not list or not all(type(r) is list and len(r) == 3 and type(r[0]) is str
                                         and type(r[1]) is int and type(r[2]) is int for r in rows):
        _fail("program.emulated: malformed")
    values["emulated"] = [{"op": op, "count": count, "cycles": cycles} for op, count, cycles in rows]
    if len(values["input_types"]) != len(values["inputs"]) or len(values["output_types"]) != len(values["outputs"]):
        _fail("program: types do not match inputs and outputs")
    for f, types in (("input_layouts", values["input_types"]), ("output_layouts", values["output_types"])):
        found = h[f]
        if type(found) is not list or (found and len(found) != len(types)):
            _fail(f"program.{f}: malformed")
        for x, t in zip(found, types, strict=False):
            if x is not None and (type(x) is not list or sorted(x) != list(range(len(t.shape)))
                                  or not all(type(d) is int for d in x)):
                _fail(f"program.{f}: not an order of the dimensions")
        values[f] = tuple(None if x is None else tuple(x) for x in found)
    for loop in values["unknown_trip_loops"]:
        if type(loop) is not dict or not {"cycles_per_iteration", "entered"} <= set(loop):
            _fail("program.unknown_trip_loops: malformed")
    if values["memory"] is not None and type(values["memory"]) is not MemoryReport:
        _fail("program.memory: not a memory report")
    if values["num_tiles"] < 1:
        _fail("program.num_tiles: below 1")
    vertex_tiles = dec.vertices["tile"]
    if len(vertex_tiles) and int(vertex_tiles.max()) >= values["num_tiles"]:
        _fail(f"vertices: a vertex on a tile beyond {values['num_tiles']}")
    for t in tensors:
        if isinstance(t.mapping, _LoadedMapping):      # checked when first read
            t.mapping._columns.num_tiles = values["num_tiles"]
        elif len(t.mapping.tiles) and int(t.mapping.tiles.max()) >= values["num_tiles"]:
            _fail(f"{t}: mapped to a tile beyond {values['num_tiles']}")
    return Program(tensors=tensors, **values)


def _int_list(x, where: str) -> list[int]:
    if type(x) is not list or not all(type(i) is int for i in x):
        _fail(f"{where}: not a list of integers")
    return x
