"""The state of one compilation while ops are lowered: the graph's tensors,
the steps emitted so far, and what each IR value became.

An IR value becomes a graph View, or stays unmaterialised when it is a
scalar seen at a bigger shape (a Splat of a constant, or a ScalarBroadcast
of a one-element tensor): element-wise vertices read those as immediates or
as one broadcast element, and nothing is stored at the big shape. So does a
Broadcast of a tensor that only element-wise ops read (a bias, a row's mean
or maximum): each vertex reads the source elements its part needs, as
Poplar's element-wise vertices read a broadcast view."""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.options import CompileOptions
from jax_ipu.compiler.planners import mapping
from jax_ipu.errors import IpuOutOfMemoryError
from jax_ipu.graph import codelets
from jax_ipu.graph.compute import ComputeSet, ReadOnce, VertexArray, compact, range_index, spans
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.programs import Copy, Execute
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import Concat, View
from jax_ipu.targets import Target


@dataclasses.dataclass(frozen=True, eq=False)
class Splat:
    value: np.ndarray              # 0-d, of the value's dtype
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class ScalarBroadcast:
    scalar: View                   # shape ()
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return self.scalar.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Broadcast:
    """source (a whole tensor, reshaped) broadcast_in_dim to shape."""
    source: View
    shape: tuple[int, ...]
    dims: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return self.source.dtype

    def view(self) -> View:
        return self.source.then("broadcast", self.shape, self.dims)


Lowered = View | Splat | ScalarBroadcast | Broadcast


# A tensor of more elements than this that is bigger than the whole IPU
# fails at once: the memory plan's per-tile report would take the host tens
# of bytes per element (gigabytes) before saying the same.
HUGE_ELEMENTS = 1 << 26


class Builder:
    def __init__(self, target: Target, options: CompileOptions):
        self.target = target
        self.options = options
        self.tensors: list[Tensor] = []
        self.steps: list = []
        self.values: dict[ir.Value, Lowered] = _Values()
        self.flops = 0.0
        self.transcendentals = 0.0
        self._mappings: dict = {}
        # Vertex arrays by what they depend on, not the tensors they name
        # (see pattern): a model's layers repeat the same products and
        # reductions over other tensors of the same shapes and mappings.
        self._patterns: dict = {}
        # Where the next small tensor's linear mapping starts (see
        # start_tile): small tensors go round the tiles, not all to tile 0.
        self._next_tile = 0
        # The block being lowered: reads of each value still to come (its ops'
        # and nested regions', and its results), and the tensors it may
        # update in place (made within it, or a loop's carried tensors in
        # the loop's body). See writable_in_place.
        self.pending_reads: collections.Counter = collections.Counter()
        self.block_tensors_from = 0
        self.block_carried: frozenset[int] = frozenset()
        # Broadcast results only element-wise clusters read (see Broadcast).
        self.lazy_broadcasts: set = set()
        # While an op made to emulate a type is lowered: (what it emulates,
        # the op it stands for). Every step emitted then is charged to it:
        # `emulated` holds (step, what, share of its cycles, source op)
        # (compiler/__init__.py's _emulated sums them after the cost pass).
        self.emulating: tuple[str, int] | None = None
        self.emulated: list[tuple] = []
        # The main function's results aliased to donated inputs: result
        # value -> the input's tensor (see lowering/elementwise.py).
        self.donors: dict[ir.Value, Tensor] = {}

    # -- tensors --
    def linear_mapping(self, size: int, dtype: np.dtype) -> TileMapping:
        key = (size, np.dtype(dtype).itemsize)
        if key not in self._mappings:
            self._mappings[key] = mapping.linear(self.target, size, dtype)
        return self._mappings[key]

    def start_tile(self, tiles_used: int) -> int:
        """The first tile of something that takes `tiles_used` consecutive
        tiles: 0 when it takes them all, otherwise the tile after the last
        small one, round the IPU. Poplar spreads small variables so (its
        linear mapping of a small tensor starts at a varying tile); starting
        each at tile 0 made tile 0 hold every scalar, bias and statistic of a
        model, and the code and vertex state of every small compute set."""
        tiles = self.target.num_tiles
        if tiles_used >= tiles:
            return 0
        start = self._next_tile
        self._next_tile = (start + tiles_used) % tiles
        return start

    def shared_start_tile(self, key, tiles_used: int) -> int:
        """start_tile for something on at most half the tiles; a bigger one
        starts where the first of its kind (key) started, as
        small_linear_mapping places tensors: each layer of a model then
        has the same tiles for the same product, and the same vertex
        pattern (see pattern)."""
        if tiles_used <= self.target.num_tiles // 2:
            return self.start_tile(tiles_used)
        key = ("start", key)
        if key not in self._mappings:
            self._mappings[key] = self.start_tile(tiles_used)
        return self._mappings[key]

    def rotated(self, m: TileMapping) -> TileMapping:
        """m (a mapping starting at tile 0 on consecutive tiles) moved to
        start at start_tile."""
        used = int(m.tiles.max()) + 1 if len(m.tiles) else 0
        start = self.start_tile(used) if used else 0
        if not start:
            return m
        return TileMapping(m.size, (m.tiles + start) % self.target.num_tiles, m.starts, m.stops)

    def small_linear_mapping(self, size: int, dtype: np.dtype) -> TileMapping:
        """The linear mapping of a new tensor. One on at most half the tiles
        starts at the next start_tile, its own; a bigger one on fewer than
        all tiles starts where every tensor of its size and width starts (so
        that element-wise ops between big tensors exchange nothing); one on
        every tile is the shared linear mapping."""
        m = self.linear_mapping(size, dtype)
        used, tiles = len(m.tiles), self.target.num_tiles
        if used >= tiles:
            return m
        if used <= tiles // 2:
            return self.rotated(m)
        key = ("rotated", size, np.dtype(dtype).itemsize)
        if key not in self._mappings:
            self._mappings[key] = self.rotated(m)
        return self._mappings[key]

    def output_mapping(self, size: int, dtype: np.dtype, inputs) -> TileMapping:
        """The mapping of an element-wise result of `size` elements: for one
        on at most half the tiles, the mapping of its first input of the same
        size read whole (as popops maps a result like its first operand, so
        nothing is exchanged); else as small_linear_mapping."""
        m = self.linear_mapping(size, dtype)
        if len(m.tiles) <= self.target.num_tiles // 2:
            for v in inputs:
                if isinstance(v, View) and v.size == size and v.is_whole_tensor:
                    return v.tensor.mapping
        return self.small_linear_mapping(size, dtype)

    def tensor(self, name: str, shape, dtype, tile_mapping: TileMapping | None = None,
               constant: np.ndarray | None = None) -> Tensor:
        shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64))
        total = self.target.num_tiles * self.target.bytes_per_tile
        if size > HUGE_ELEMENTS and size * dtype.itemsize > total:
            # Fails before any per-element mapping or cost array is made on
            # the host (a 2**30-element tensor took over 24 GB there); smaller
            # ones get the memory plan's report, tile by tile.
            raise IpuOutOfMemoryError(
                f"out of memory: {name} {dtype.name}{list(shape)} takes {size * dtype.itemsize:,} bytes, more "
                f"than all of {self.target.describe()} holds ({total:,} bytes). Use smaller arrays or "
                f"batches, or split the work over several IPUs")
        t = Tensor(len(self.tensors), name, shape, dtype,
                   tile_mapping or self.small_linear_mapping(size, dtype), constant)
        self.tensors.append(t)
        return t

    def constant(self, name: str, value: np.ndarray) -> View:
        value = np.array(value, order="C")  # a copy of its own, and 0-d stays 0-d
        value.setflags(write=False)
        return View(self.tensor(name, value.shape, value.dtype, constant=value))

    def pattern(self, key, make):
        """make() -> a tuple (of arrays) describing vertices, built once per
        key: the arrays are shared, never written, by every compute set
        with that key (the same product in each layer of a transformer), so
        the cost pass also counts their exchange once (see
        cost.cost_steps). Keys name mappings by identity (they never
        change) and hold them, so an id is never reused while compiling."""
        if key not in self._patterns:
            made = make()
            for part in made:
                if isinstance(part, np.ndarray):
                    part.setflags(write=False)    # shared: a write would change other compute sets
            self._patterns[key] = made
        return self._patterns[key]

    # -- values --
    def view(self, value: ir.Value, name: str = "") -> View:
        """The value in a tensor, materialising a Splat or a broadcast."""
        lowered = self.values[value]
        if isinstance(lowered, View):
            return lowered
        t = self.tensor(name or "broadcast", lowered.shape, lowered.dtype)
        if isinstance(lowered, Splat):
            self.fill(t, lowered.value)
        elif isinstance(lowered, Broadcast):
            self.copy(lowered.view(), t)
        else:
            src = lowered.scalar.then("broadcast", lowered.shape, ())
            self.copy(src, t)
        return View(t)

    def writable_in_place(self, x: View, op: ir.Op) -> bool:
        """Whether `op`, reading x (a whole tensor) as its operand, may write
        its result into x's tensor, as XLA's buffer assignment would: the
        tensor belongs to the block being lowered (not an input, constant or
        value from outside, which a loop would read again), and nothing
        lowered to a view of it is read after `op`."""
        return self.writable_after(x.tensor, [op])

    def writable_after(self, t: Tensor, ops: list) -> bool:
        """Whether t may be overwritten by `ops` (being lowered): it belongs
        to the block being lowered, and no value lowered to a view of it is
        read other than by them."""
        if t.constant is not None or not (t.id >= self.block_tensors_from or t.id in self.block_carried):
            return False
        over = self.values.over(t)
        if not over:
            return True
        mine = collections.Counter(v for op in ops for v in op.operands if v in over)
        pending = self.pending_reads
        return all(pending.get(v, 0) <= mine[v] for v in over)

    # -- steps --
    def fill(self, t: Tensor, value: np.ndarray) -> None:
        self.execute(f"{t.name}/fill", codelets.Fill(t, value),
                     self.vertices_over(f"Fill<{t.dtype.name}>", [t], [],
                                        lambda n: cost.elementwise_cycles(self.target, n, t.dtype, [])))

    def execute(self, name: str, kernel, vertices, exchange=None) -> Execute:
        step = Execute(ComputeSet(name, vertices, kernel, exchange))
        self.steps.append(step)
        self._charge(step)
        return step

    def rerun(self, compute_set: ComputeSet) -> Execute:
        """An Execute of a compute set run before (a serial loop's body):
        its vertices, and their state, are the earlier run's."""
        step = Execute(compute_set)
        self.steps.append(step)
        self._charge(step)
        return step

    def copy(self, src: View | Concat, dst: Tensor) -> None:
        step = Copy(src, dst)
        self.steps.append(step)
        self._charge(step)

    def _charge(self, step) -> None:
        if self.emulating is not None:
            what, source = self.emulating
            self.emulated.append((step, what, 1.0, source))

    @staticmethod
    def by_tile(m: TileMapping) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A mapping's intervals grouped by tile, as a VertexArray holds
        them: (tiles [v], intervals [k, 2] in tile order, offsets [v + 1],
        elements per tile [v])."""
        order = np.argsort(m.tiles, kind="stable")
        tiles_sorted = m.tiles[order]
        intervals = np.stack([m.starts[order], m.stops[order]], axis=1)
        if not len(order):
            empty = np.zeros(0, dtype=np.int64)
            return empty, intervals, np.zeros(1, dtype=np.int64), empty
        first = np.flatnonzero(np.r_[True, tiles_sorted[1:] != tiles_sorted[:-1]])
        counts = np.add.reduceat(intervals[:, 1] - intervals[:, 0], first)
        return tiles_sorted[first], intervals, np.r_[first, len(order)], counts

    def _compact_by_tile(self, m: TileMapping) -> tuple:
        tiles, intervals, offsets, counts = self.by_tile(m)
        return tiles, compact(intervals), offsets, counts

    @staticmethod
    def cycles_by_count(counts: np.ndarray, cycles) -> np.ndarray:
        """cycles(n) of each count, called once per distinct count (most
        tiles hold the same one)."""
        unique, inverse = np.unique(counts, return_inverse=True)
        return np.array([int(cycles(int(n))) for n in unique], dtype=np.int64)[inverse.ravel()]

    @staticmethod
    def one_element(vertices: int) -> tuple[np.ndarray, np.ndarray]:
        """Each vertex's read of element 0 (a scalar input): (intervals, offsets)."""
        return np.tile(np.array([[0, 1]], dtype=np.int64), (vertices, 1)), np.arange(vertices + 1)

    def _broadcast_reads(self, m: TileMapping, view: View, intervals, offsets):
        """broadcast_reads of the view at m's intervals by tile, once per
        mapping and view ops over a tensor of that shape (a bias or a
        normalisation's statistics broadcast over each layer's outputs)."""
        key = ("broadcast reads", m, view.tensor.shape, view.ops)
        try:
            hash(key)
        except TypeError:    # (ops holding arrays)
            return broadcast_reads(view, intervals, offsets)
        return self.pattern(key, lambda: broadcast_reads(view, intervals, offsets))

    def vertices_over(self, codelet: str, outs: list[Tensor], inputs: list[View], cycles) -> VertexArray:
        """One vertex per tile of the outputs' (shared) mapping, writing that
        tile's part of each output and reading the same elements of each
        whole-tensor input (or the one element of a scalar input).
        cycles(n) -> cycles of a vertex over n elements."""
        m = outs[0].mapping
        # Shared by every compute set over this mapping (see pattern).
        tiles, intervals, offsets, counts = self.pattern(("by tile", m), lambda: self._compact_by_tile(m))
        one = self.pattern(("one element", len(tiles)), lambda: self.one_element(len(tiles)))
        reads = tuple((v.tensor, *self._broadcast_reads(m, v, intervals, offsets))
                      if v.ops and v.ops[-1][0] == "broadcast"
                      else (v.tensor, intervals, offsets) if v.size == m.size else (v.tensor, *one) for v in inputs)
        writes = tuple((out, intervals, offsets) for out in outs)
        # (A whole input of the outputs' size: each element read once, where its output lies.)
        once = tuple(ReadOnce(m) if v.size == m.size and v.is_whole_tensor else None for v in inputs)
        return VertexArray(codelet, tiles, self.cycles_by_count(counts, cycles), reads, writes, once)


def broadcast_reads(view: View, intervals: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The source intervals each vertex reads of `view` (a tensor broadcast
    by its last op) to make the elements `intervals` of it (CSR by vertex
    in `offsets`): (intervals, offsets [v, 2]), each vertex's sorted and
    merged (see VertexArray for shared ranges).
    Worked out a row at a time, a row being the trailing axes over which
    the source is contiguous or constant, so the work is the rows touched,
    not the elements."""
    _, shape, dims = view.ops[-1]
    src_shape = View(view.tensor, view.ops[:-1]).shape
    src_strides = np.cumprod((1,) + tuple(src_shape[::-1]))[:-1][::-1] if src_shape else ()
    strides = [0] * len(shape)
    for j, axis in enumerate(dims):
        if src_shape[j] == shape[axis] and shape[axis] > 1:
            strides[axis] = int(src_strides[j])
    # The row: trailing axes all of stride 0, or contiguous in the source.
    row, axis = 1, len(shape)
    constant = bool(shape) and strides[-1] == 0
    while axis > 0:
        a = axis - 1
        if shape[a] == 1 or (strides[a] == 0 if constant else strides[a] == row):
            row *= shape[a]
            axis -= 1
        else:
            break
    lead_shape, lead_strides = shape[:axis], np.asarray(strides[:axis], np.int64)
    vertex = range_index(offsets[:-1], offsets[1:])
    first, last = intervals[:, 0] // row, (intervals[:, 1] - 1) // row
    which = range_index(first, last + 1)
    r = spans(first, last + 1)
    base = (np.stack(np.unravel_index(r, lead_shape)) * lead_strides[:, None]).sum(0) if lead_shape \
        else np.zeros(len(r), np.int64)
    if constant:
        lo, hi = base, base + 1
    else:
        lo = base + np.maximum(intervals[which, 0] - r * row, 0)
        hi = base + np.minimum(intervals[which, 1] - r * row, row)
    # Union per vertex: vertex v's intervals moved to [v * span, (v + 1) * span).
    span = view.tensor.size + 1
    owner = vertex[which]
    lo, hi = lo + owner * span, hi + owner * span
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    new = np.ones(len(lo), bool)     # (none for an empty result: jnp.outer of a length-0 vector)
    new[1:] = lo[1:] > reach[:-1]
    starts = lo[new]
    stops = reach[np.r_[np.flatnonzero(new)[1:] - 1, len(lo) - 1]] if len(lo) else reach[:0]
    owner = starts // span
    out = np.stack([starts - owner * span, stops - owner * span], axis=1)
    count = np.bincount(owner, minlength=len(offsets) - 1)
    csr = np.r_[0, np.cumsum(count)]
    # Vertices reading one interval (most: a bias or statistics read whole,
    # or a run of rows) name a shared copy of it, so that the exchange
    # splits it by owner once, not once per reader.
    single = np.flatnonzero(count == 1)
    if not len(single):
        return out, csr
    keys, group = np.unique(out[csr[single], 0] * span + out[csr[single], 1], return_inverse=True)
    shared = np.stack(np.divmod(keys, span), axis=1)
    ranges = np.stack([csr[:-1], csr[1:]], axis=1) + len(shared)
    ranges[single, 0] = group.ravel()
    ranges[single, 1] = group.ravel() + 1
    return np.concatenate([shared, out]), ranges


class _Values(dict):
    """Builder.values: the lowered value of each ir.Value, indexed by the
    tensors each is a view of (writable_after asks which values read a
    tensor; scanning every pending value for each ask took seconds of a
    large program's lowering)."""

    def __init__(self):
        super().__init__()
        self._over: dict[Tensor, set] = {}

    def __setitem__(self, value, lowered) -> None:
        old = self.get(value)
        if old is not None:
            for t in _tensors_of(old):
                self._over[t].discard(value)
        super().__setitem__(value, lowered)
        for t in _tensors_of(lowered):
            self._over.setdefault(t, set()).add(value)

    def over(self, t: Tensor) -> set:
        """The values lowered to a view of t (not to be changed)."""
        return self._over.get(t, _NONE)


_NONE: frozenset = frozenset()


def _tensors_of(lowered) -> tuple:
    if isinstance(lowered, View):
        return (lowered.tensor,)
    if isinstance(lowered, Concat):
        return lowered.tensors
    if isinstance(lowered, ScalarBroadcast):
        return (lowered.scalar.tensor,)
    if isinstance(lowered, Broadcast):
        return (lowered.source.tensor,)
    return ()
