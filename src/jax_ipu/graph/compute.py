"""Compute sets and vertices. A vertex runs a codelet on one tile over
regions of tensors; a compute set is vertices that run in one BSP superstep.
Alongside its vertices, a compute set carries its `kernel`: what all of them
compute together (graph.codelets), which the engine executes in one
vectorised step instead of vertex by vertex."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jax_ipu.graph.tensors import Tensor


@dataclasses.dataclass(eq=False)
class Region:
    """Intervals ([k, 2] array of flattened [start, stop)) of one tensor."""
    tensor: Tensor
    intervals: np.ndarray

    @property
    def num_elements(self) -> int:
        return int((self.intervals[:, 1] - self.intervals[:, 0]).sum())


@dataclasses.dataclass(eq=False)
class Vertex:
    codelet: str                   # e.g. "ElementwiseChain<float>", "MatMulPartial<half,float>"
    tile: int
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    cycles: int                    # estimated cycles on its tile (compiler.cost)


@dataclasses.dataclass(eq=False)
class DataDependentExchange:
    """The exchange of a compute set whose sources or destinations depend
    on indices known only at run time (popops multiSlice / multiUpdate):
    it replaces the exchange the vertices' read regions imply. Per tile,
    bytes sent and received over all `rounds` (each round an exchange and a
    sync), and the bytes of exchange buffers held while the step runs."""
    rounds: int
    sent: np.ndarray               # [tiles]
    received: np.ndarray           # [tiles]
    buffers: np.ndarray            # [tiles] one round's indices, staged elements or received updates


@dataclasses.dataclass(eq=False)
class ComputeSet:
    name: str
    vertices: list[Vertex]          # or a VertexArray
    kernel: object                 # a graph.codelets kernel
    exchange: DataDependentExchange | None = None

    def tiles(self) -> np.ndarray:
        return np.unique(vertex_tiles(self.vertices))


def compact(intervals) -> np.ndarray:
    """An interval array as int32 where it fits: a large convolutional
    network's intervals take gigabytes as int64. (An int32 array is itself.)"""
    intervals = np.asarray(intervals)
    small = intervals.dtype != np.int32 and intervals.size and intervals.max() < 2 ** 31 \
        and intervals.min() >= 0
    return intervals.astype(np.int32) if small else intervals


class _Compact:
    """compact() once per array shared by several regions."""

    def __init__(self):
        self.done: dict = {}

    def __call__(self, intervals) -> np.ndarray:
        if isinstance(intervals, RowIntervals):
            return intervals
        key = id(intervals)
        if key not in self.done:
            self.done[key] = (intervals, compact(intervals))
        return self.done[key][1]


@dataclasses.dataclass(frozen=True, eq=False)
class Rows:
    """A read's intervals as rows (arrays over groups g): vertex[g] reads
    base[g] + i * stride[g] + [0, width[g]) for each i < count[g], with
    width <= stride. What a VertexArray's read names as intervals, told
    the compiler's cost pass in this form too, which counts exchange per
    tile run a group meets, not per interval (an outer reduction's
    vertices read a row per batch and field position: tens of millions of
    intervals in a convolutional network's step)."""
    vertex: np.ndarray
    base: np.ndarray
    width: np.ndarray
    stride: np.ndarray
    count: np.ndarray

    def __post_init__(self):
        # Widths, strides and counts are mostly one value over all groups
        # (a convolution's input rows of one box shape): held once.
        for name in ("width", "stride", "count"):
            object.__setattr__(self, name, _lean(getattr(self, name)))

    def intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """(intervals [k, 2], the vertex of each): the rows listed."""
        base = np.repeat(self.base, self.count) + _row_steps(self.count, self.stride)
        return np.stack([base, base + np.repeat(self.width, self.count)], axis=1), np.repeat(self.vertex, self.count)


INT32_MAX = 2 ** 31 - 1


class RowIntervals:
    """A read's intervals held as the rows they repeat, where a VertexArray
    read would list them ([k, 2]): vertex v's intervals are, for each row
    i < count[v] in turn, its runs [starts[r], stops[r]) (r in
    runs[v]:runs[v + 1], ascending) shifted by i * stride[v]. An outer
    reduction's vertices read the same runs of columns in every reduced
    row (a BatchNorm statistic's tile: its channels in each batch and
    field position): listed, tens of millions of intervals, most of a
    convolutional network's compiled program on the host. They are listed
    only where a list is needed (checks, profiles), one vertex or one read
    at a time; the cost pass reads them as Rows, the serializer as rows.

    listed() gives what the list would be: int32 when every stop fits it,
    else int64 (as compact() gives them)."""

    __slots__ = ("starts", "stops", "runs", "count", "stride", "_dtype")

    def __init__(self, starts, stops, runs, count, stride):
        self.starts = compact(np.asarray(starts, np.int64))
        self.stops = compact(np.asarray(stops, np.int64))
        self.runs = np.asarray(runs, np.int64)
        self.count, self.stride = _lean(np.asarray(count, np.int64)), _lean(np.asarray(stride, np.int64))
        self._dtype = None

    @property
    def num_vertices(self) -> int:
        return len(self.count)

    def _per_vertex(self) -> np.ndarray:
        return self.runs[1:] - self.runs[:-1]

    def offsets(self) -> np.ndarray:
        """CSR offsets [v + 1] of the listed intervals."""
        return np.r_[0, np.cumsum(self.count * self._per_vertex())].astype(np.int64)

    def __len__(self) -> int:
        return int((self.count * self._per_vertex()).sum())

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.starts, self.stops, self.runs, self.count, self.stride))

    @property
    def dtype(self) -> np.dtype:
        """The listed intervals' type: int32 when the last row's stops fit it."""
        if self._dtype is None:
            n = self._per_vertex()
            last = np.zeros(0, np.int64)
            if len(self.stops):
                vertex = np.repeat(np.arange(len(n)), n)
                last = self.stops.astype(np.int64) + (self.count[vertex] - 1).clip(0) * self.stride[vertex]
                last = last[self.count[vertex] > 0]
            self._dtype = np.dtype(np.int32 if int(last.max(initial=0)) <= INT32_MAX else np.int64)
        return self._dtype

    def listed(self) -> np.ndarray:
        """All the intervals [k, 2], vertex after vertex."""
        n = self._per_vertex()
        rows = np.repeat(np.arange(len(n)), self.count)                 # the vertex of each row
        shift = spans(np.zeros(len(n), np.int64), self.count) * self.stride[rows]
        per_row = n[rows]
        run = spans(self.runs[:-1][rows], self.runs[1:][rows])           # the run of each interval
        shift = np.repeat(shift, per_row)
        out = np.empty((len(run), 2), self.dtype)
        out[:, 0] = self.starts[run] + shift
        out[:, 1] = self.stops[run] + shift
        return out

    def of_vertex(self, v: int) -> np.ndarray:
        """Vertex v's intervals [count[v] x runs, 2]."""
        r0, r1 = int(self.runs[v]), int(self.runs[v + 1])
        shift = np.arange(int(self.count[v]), dtype=np.int64)[:, None] * int(self.stride[v])
        out = np.empty((int(self.count[v]) * (r1 - r0), 2), self.dtype)
        out[:, 0] = (self.starts[r0:r1].astype(np.int64) + shift).ravel()
        out[:, 1] = (self.stops[r0:r1].astype(np.int64) + shift).ravel()
        return out

    def rows(self) -> Rows:
        """The same intervals as Rows (a group per vertex and run), for the
        cost pass."""
        n = self._per_vertex()
        vertex = np.repeat(np.arange(len(n)), n)
        starts = self.starts.astype(np.int64)
        return Rows(vertex, starts, self.stops.astype(np.int64) - starts, self.stride[vertex], self.count[vertex])


def csr_part(intervals: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(intervals, offsets [v + 1]) of a part with shared ranges (offsets
    [v, 2]) listed once per vertex that names them; a CSR part as it is."""
    if offsets.ndim == 2:
        intervals = intervals[spans(offsets[:, 0], offsets[:, 1])]
        offsets = np.r_[0, np.cumsum(offsets[:, 1] - offsets[:, 0])]
    return intervals, offsets


def _lean(values) -> np.ndarray:
    """The array, or its one value broadcast (no memory per element) when
    all are equal (a reduction's row count and stride, on every tile)."""
    values = np.asarray(values)
    if values.ndim == 1 and len(values) > 1 and values.strides[0] and (values == values[0]).all():
        return np.broadcast_to(values[0], values.shape)
    return values


def interval_array(intervals) -> np.ndarray:
    """A VertexArray part's intervals as a [k, 2] array (RowIntervals listed)."""
    return intervals.listed() if isinstance(intervals, RowIntervals) else intervals


@dataclasses.dataclass(frozen=True, eq=False)
class SharedRows:
    """Rows of a read whose vertices share regions (offsets [v, 2]):
    rows.vertex names the region (not a vertex), region[v] the one vertex v
    reads; the region's intervals are its rows (a convolution's input
    regions: a run of channels per batch and field position, read by the
    vertices of every output-channel block)."""
    rows: Rows
    region: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class ReadOnce:
    """A read, told the cost pass, that takes each element of its tensor
    exactly once, element q on the tile holding element
    (q // inner) % mapping.size of `mapping`: an element-wise step's input
    read where its output lies, or a reduction's partials read where
    their outputs lie (each tile reads the partials of its own outputs).
    Its exchange follows from the two mappings' runs alone
    (cost._once_exchange), not from its intervals: a convolution's
    partials are mapped in hundreds of thousands of runs, and each read
    interval met several."""
    mapping: object
    inner: int = 1


def _row_steps(count: np.ndarray, stride: np.ndarray) -> np.ndarray:
    """i * stride of each row i < count of each group, one group after another."""
    return spans(np.zeros(len(count), np.int64), count) * np.repeat(stride, count)


class VertexArray(Sequence):
    """The vertices of one codelet in a compute set, as arrays over the
    vertices (Poplar's graphs are built so, from regular mappings): tile
    and cycles of each, and per tensor read or written, its intervals
    grouped by vertex: offsets [v + 1] (CSR: vertex i's are
    intervals[offsets[i]:offsets[i+1]]) or, where vertices share what they
    read, offsets [v, 2] (vertex i's are intervals[offsets[i, 0]:offsets[i, 1]],
    ranges that several vertices may name: a matmul's row block is read by
    every vertex of its column blocks, and listing it once per reader took
    tens of millions of intervals in a transformer's forward pass).
    The compiler's passes read the arrays; indexing or iterating makes
    Vertex objects (validation, profiles). A compiled convolutional
    network holds millions of vertices: as Python objects they would cost
    most of its compile. read_rows: per read, its intervals as Rows (or
    None; or SharedRows, ReadOnce), for the cost pass; not part of the program (not
    serialized)."""

    def __init__(self, codelet: str, tiles: np.ndarray, cycles: np.ndarray,
                 reads: tuple = (), writes: tuple = (), read_rows: tuple = ()):
        self.codelet = codelet
        self.tiles = np.asarray(tiles, dtype=np.int64)
        self.cycles = np.asarray(cycles, dtype=np.int64)
        compact = _Compact()
        # offsets [v + 1] or [v, 2]; intervals [k, 2], or RowIntervals
        # (with offsets [v + 1], those it lists)
        self.reads = tuple((t, compact(iv), off) for t, iv, off in reads)
        self.writes = tuple((t, compact(iv), off) for t, iv, off in writes)
        self._read_rows = tuple(read_rows) + (None,) * (len(self.reads) - len(read_rows))

    @property
    def read_rows(self) -> tuple:
        """Per read, its Rows, SharedRows or ReadOnce (or None): a
        RowIntervals read's Rows made when asked (the cost pass asks once)."""
        return tuple(iv.rows() if rows is None and isinstance(iv, RowIntervals) else rows
                     for (_, iv, _), rows in zip(self.reads, self._read_rows, strict=True))

    def __len__(self) -> int:
        return len(self.tiles)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]

        def regions(parts):
            return tuple(Region(t, iv.of_vertex(i) if isinstance(iv, RowIntervals) else
                                iv[slice(*off[i])] if off.ndim == 2 else iv[off[i]:off[i + 1]])
                         for t, iv, off in parts)
        return Vertex(self.codelet, int(self.tiles[i]), regions(self.reads), regions(self.writes),
                      int(self.cycles[i]))

    def listed(self, field: str) -> tuple:
        """The reads or writes with CSR offsets [v + 1]: shared ranges
        listed once per vertex that names them (as Vertex objects hold them)."""
        return tuple((tensor, *csr_part(interval_array(intervals), offsets))
                     for tensor, intervals, offsets in getattr(self, field))

    def region_arrays(self, field: str):
        """(tensor, intervals [k, 2], vertex index [k]) per region."""
        for tensor, intervals, offsets in getattr(self, field):
            if offsets.ndim == 1:
                yield tensor, interval_array(intervals), range_index(offsets[:-1], offsets[1:])
            else:
                yield tensor, intervals[spans(offsets[:, 0], offsets[:, 1])], range_index(offsets[:, 0], offsets[:, 1])

    def region_groups(self, field: str):
        """(tensor, intervals [k, 2], group of each interval [k], reading
        vertices [n], their groups [n]) per region: the vertices of a group
        read the same intervals (each its own group under CSR offsets)."""
        for region in getattr(self, field):
            yield self.grouped(region)

    def grouped(self, region: tuple) -> tuple:
        """region_groups' tuple for one (tensor, intervals, offsets) of
        the reads or writes."""
        tensor, intervals, offsets = region
        vertices = np.arange(len(self.tiles))
        if offsets.ndim == 1:
            return tensor, interval_array(intervals), range_index(offsets[:-1], offsets[1:]), vertices, vertices
        keys, group = np.unique(offsets[:, 0] * (len(intervals) + 1) + offsets[:, 1], return_inverse=True)
        begins, stops = np.divmod(keys, len(intervals) + 1)
        return tensor, intervals[spans(begins, stops)], range_index(begins, stops), vertices, group.ravel()


def spans(begins: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The positions of the ranges [begins[i], stops[i]) one after another
    (by np.repeat, not gathers by range index: a third of the time)."""
    counts = stops - begins
    return np.arange(int(counts.sum())) + np.repeat(begins - (np.cumsum(counts) - counts), counts)


def range_index(begins: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """For each position spans() gives, the range it belongs to (with CSR
    offsets, offsets[:-1] and offsets[1:]: the vertex of each interval)."""
    return np.repeat(np.arange(len(begins)), stops - begins)


def vertex_tiles(vertices) -> np.ndarray:
    if isinstance(vertices, VertexArray):
        return vertices.tiles
    return np.fromiter((v.tile for v in vertices), dtype=np.int64, count=len(vertices))


def vertex_cycles(vertices) -> np.ndarray:
    if isinstance(vertices, VertexArray):
        return vertices.cycles
    return np.fromiter((v.cycles for v in vertices), dtype=np.int64, count=len(vertices))


def vertex_codelets(vertices) -> list[str]:
    if isinstance(vertices, VertexArray):
        return [vertices.codelet] * len(vertices)
    return [v.codelet for v in vertices]


def region_arrays(vertices, field: str):
    """(tensor, intervals [k, 2], vertex index [k]) of each region of the
    vertices' reads or writes (a tensor may come more than once)."""
    if isinstance(vertices, VertexArray):
        yield from vertices.region_arrays(field)
        return
    for i, v in enumerate(vertices):
        for region in getattr(v, field):
            yield region.tensor, region.intervals, np.full(len(region.intervals), i)


def region_groups(vertices, field: str):
    """As VertexArray.region_groups, for any vertices."""
    if isinstance(vertices, VertexArray):
        yield from vertices.region_groups(field)
        return
    for i, v in enumerate(vertices):
        for region in getattr(v, field):
            yield region.tensor, region.intervals, np.zeros(len(region.intervals), np.int64), \
                np.array([i]), np.zeros(1, np.int64)


def region_tensor_ids(vertices, field: str) -> set:
    if isinstance(vertices, VertexArray):
        return {t.id for t, _, _ in getattr(vertices, field)}
    return {r.tensor.id for v in vertices for r in getattr(v, field)}
