"""reduce: each operand rearranged to [kept, reduced] (a Copy when that is a
layout change), partial reductions of equal chunks spread over tiles (the
operand padded with the init value when its length has no divisor that
spreads it), then a
cross-tile stage combining each output's partials and the init value in a
fixed order; with one partial per output (rows that fit a tile), a single
stage applies the init itself. A body of one op (add, max, ...) on one operand reduces with
that op, fp16 sums and products accumulating in fp32; any other body of
element-wise ops (argmax's compare-and-select over values and indices) is
applied pairwise in a tree."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder, ScalarBroadcast, Splat
from jax_ipu.compiler.lowering.elementwise import SEMANTIC_ATTRS
from jax_ipu.compiler.lowering.layout import copy_padded, copy_to_new, name_of
from jax_ipu.compiler.lowering.registry import register
from jax_ipu.compiler.planners.mapping import MIN_BYTES_PER_TILE, spread
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets
from jax_ipu.graph.compute import ReadOnce, RowIntervals, VertexArray
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.ops import ELEMENTWISE_OPS, REDUCE_OPS
from jax_ipu.targets import BFLOAT16, COMPLEX64

# A reduction with one partial per output (and no wider accumulator) is
# one compute set, not partials and a combine (see _single_stage).
SINGLE_STAGE = True
# Bodies of one op on one operand that reduce with a numpy ufunc.
SINGLE_OP = frozenset(REDUCE_OPS)
# 16-bit floats, whose reduce sums accumulate in float32.
HALF_FLOATS = frozenset({np.dtype(np.float16), BFLOAT16})


def single_op(body: ir.Block) -> str | None:
    """The op of a body of one REDUCE_OPS op on its two arguments, whose
    numpy ufunc reduces (a complex product is not one: numpy's rounds as
    the IPU's does not, so its body runs, as ops_complex computes it)."""
    if (len(body.args) == 2 and len(body.ops) == 1 and len(body.results) == 1
            and body.ops[0].name in SINGLE_OP and body.results[0] is body.ops[0].results[0]
            and set(body.ops[0].operands) == set(body.args)
            and not (body.ops[0].name == "multiply" and body.args[0].type.dtype == COMPLEX64)):
        return body.ops[0].name
    return None


def _body_program(op: ir.Op, body: ir.Block, outer: dict | None = None) -> tuple[tuple, tuple]:
    """The body as (instructions, result registers) for a TreeReduce.
    `outer` (the builder's values) gives constants the body reads from
    outside it, which become constant instructions."""
    registers = {arg: i for i, arg in enumerate(body.args)}
    program = []

    def read(v: ir.Value) -> bool:
        """Whether v has a register, giving an outer constant one."""
        if v in registers:
            return True
        lowered = (outer or {}).get(v)
        if not isinstance(lowered, Splat):
            return False
        value = np.asarray(lowered.value).astype(v.type.dtype).reshape(())
        program.append(codelets.Instruction("constant", (), v.type.dtype, (("value", value),)))
        registers[v] = len(body.args) + len(program) - 1
        return True

    for inner in body.ops:
        dtype = inner.results[0].type.dtype
        if (inner.name in ("broadcast_in_dim", "reshape") and inner.results[0].type.shape == ()
                and read(inner.operands[0])):
            # A scalar to a scalar (jnp's operators emit them): the same register.
            registers[inner.results[0]] = registers[inner.operands[0]]
            continue
        if inner.name == "constant":
            value = np.asarray(inner.attrs["value"]).astype(dtype).reshape(())
            program.append(codelets.Instruction("constant", (), dtype, (("value", value),)))
        elif inner.name in ELEMENTWISE_OPS and all([read(v) for v in inner.operands]):
            attrs = tuple(sorted((k, inner.attrs[k]) for k in SEMANTIC_ATTRS if k in inner.attrs))
            program.append(codelets.Instruction(inner.name, tuple(registers[v] for v in inner.operands),
                                                dtype, attrs))
        else:
            raise IpuUnimplementedError.for_op(
                op, f"a reduction body with stablehlo.{inner.name} is not supported (bodies may hold "
                    "element-wise ops and constants on the block's arguments)", "File an issue")
        registers[inner.results[0]] = len(body.args) + len(program) - 1
    if not all([read(v) for v in body.results]):
        raise IpuUnimplementedError.for_op(op, "a reduction body returning a value computed outside it "
                                               "at run time is not supported", "File an issue")
    return tuple(program), tuple(registers[v] for v in body.results)


# When the equal chunks of a reduced length (a prime, say) would use fewer
# than 1/UNEVEN of the tiles the work deserves, the operand is padded with
# the init value up to a length that splits well (StableHLO lets the init
# value be applied any number of times). A sum of 300,007 elements was one
# chunk on one tile: 1.2 MB there, out of memory.
UNEVEN = 4


def _chunking(reduced: int, kept: int, tiles: int, min_chunk: int) -> tuple[int, int, int]:
    """(partials per output, elements per chunk, init-valued elements padded
    after the reduced ones): spread the work over idle tiles in equal chunks
    of at least min_chunk elements, padded when no divisor spreads it."""
    if kept >= tiles or reduced <= min_chunk:
        return 1, reduced, 0
    limit = max(1, min(tiles // max(kept, 1), reduced // min_chunk))
    chunks = max(d for d in range(1, limit + 1) if reduced % d == 0)
    if chunks * UNEVEN >= limit:
        return chunks, reduced // chunks, 0
    size = -(-reduced // limit)
    chunks = -(-reduced // size)
    return chunks, size, chunks * size - reduced


# Outputs a row must hold for a reduction over leading dims to combine
# rows (numpy then adds contiguous runs of at least this many elements);
# narrower ones are transposed first and reduced along rows. (A conv bias
# gradient, a sum of [32, 28, 28, 16] over all but the channels, ran
# several times faster by rows of 16 than transposed.)
OUTER_MIN_KEPT = 16
# Rows a tile reduces at least in an outer reduction: the partials are at
# most 1/8 of the input's bytes.
OUTER_MIN_ROWS = 8
# Chunks of rows at most in an outer reduction; column groups use the rest
# of the tiles. Each output combines a partial per chunk, a one-element
# interval each: 784 chunks of a [6272, 512] statistic made 401K of them
# (tens of millions in a large network's step), with more exchange per
# combining tile.
OUTER_MAX_CHUNKS = 256
# A reduction of one partial per output receives, on each tile, every
# input element of the outputs it holds. The default mapping of the
# outputs (at least 256 B a tile) put a 1,024-channel BatchNorm statistic
# on 16 tiles, each receiving 64 channels of all 196 x batch rows (200 KB
# at batch 4, the busiest tile's peak), and a LayerNorm's 1,024 row
# statistics of 768 float32 on 16 tiles (196 KB each, 49K cycles of
# exchange, where the rows are spread over the IPU); its outputs are
# spread so that a tile receives at most about this many bytes.
READ_BYTES = 16 * 1024
def _outer_reads_by_tile(mapping: TileMapping, size: int, kept: int) -> tuple[RowIntervals, np.ndarray]:
    """The reads of the [size, kept] input behind each tile's outputs
    [kept], as a VertexArray holds them (vertices in ascending tile order,
    the tiles of Builder.by_tile(mapping); offsets [tiles + 1]): each run
    of outputs [o0, o1) on the tile in each of the `size` rows, row after
    row, the runs ascending within a row. Held as RowIntervals (a row per
    batch and field position: listed, tens of millions of intervals in a
    convolutional network's step)."""
    order = np.lexsort((mapping.starts, mapping.tiles))
    tile, starts, stops = mapping.tiles[order], mapping.starts[order], mapping.stops[order]
    # Runs that touch on one tile are one run of outputs.
    first = np.ones(len(tile), bool)
    first[1:] = (tile[1:] != tile[:-1]) | (starts[1:] != stops[:-1])
    at = np.flatnonzero(first)
    last = np.append(at[1:], len(tile)) - 1
    tile = tile[at]
    new_tile = np.flatnonzero(np.r_[True, tile[1:] != tile[:-1]]) if len(tile) else np.zeros(0, np.int64)
    tiles = len(new_tile)
    rows = RowIntervals(starts[at], stops[last], np.r_[new_tile, len(tile)], np.full(tiles, size, np.int64),
                        np.full(tiles, kept, np.int64))
    return rows, rows.offsets()


def _init_source(lowered) -> View | np.ndarray:
    """A reduction's init value: an immediate, or a one-element view."""
    if isinstance(lowered, Splat):
        return lowered.value
    return lowered.scalar if isinstance(lowered, ScalarBroadcast) else lowered.then("reshape", ())


@register("reduce")
def reduce(b: Builder, op: ir.Op) -> None:
    n = len(op.operands) // 2
    body = op.regions[0]
    single = single_op(body) if n == 1 else None
    program, results = _body_program(op, body, b.values) if single is None else ((), ())
    x_t = op.operands[0].type
    dims = sorted(op.attrs["dimensions"])
    kept_dims = [d for d in range(len(x_t.shape)) if d not in dims]
    kept = int(np.prod([x_t.shape[d] for d in kept_dims], dtype=np.int64))
    reduced = int(np.prod([x_t.shape[d] for d in dims], dtype=np.int64))
    inits = [b.values[v] for v in op.operands[n:]]
    if reduced == 0 or kept == 0:
        for result, init in zip(op.results, inits, strict=True):
            b.values[result] = (Splat(init.value, result.type.shape) if isinstance(init, Splat)
                                else ScalarBroadcast(_init_source(init), result.type.shape))
        return
    dtypes = [r.type.dtype for r in op.results]
    min_chunk = max(1, MIN_BYTES_PER_TILE // max(d.itemsize for d in dtypes))
    # Reduced dims leading (a sum over the batch, BatchNorm's statistics):
    # each tile combines a run of whole rows where they live, as Poplar
    # reduces outer dimensions, instead of a transposing Copy first.
    outer = (single is not None and kept >= OUTER_MIN_KEPT and dims == list(range(len(dims))))
    if outer:
        chunks, size, pad = _chunking(reduced, 1, min(b.target.num_tiles, OUTER_MAX_CHUNKS),
                                      max(OUTER_MIN_ROWS, -(-min_chunk // kept)))
    else:
        chunks, size, pad = _chunking(reduced, kept, b.target.num_tiles, min_chunk)
    xs = []
    for value, init in zip(op.operands[:n], inits, strict=True):
        x = b.view(value, name_of(op))
        if outer:
            if pad:
                x = copy_padded(b, op, x.then("reshape", (reduced, kept)), 0, pad, _init_source(init))
            xs.append(x.then("reshape", (chunks, size, kept)))
            continue
        if kept_dims + dims != sorted(kept_dims + dims):
            x = x.then("transpose", tuple(kept_dims + dims))
            if not pad:
                x = copy_to_new(b, op, x)
        if pad:
            x = copy_padded(b, op, x.then("reshape", (kept, reduced)), 1, pad, _init_source(init))
        xs.append(x.then("reshape", (kept, chunks, size)))
    # fp16 and bf16 sums and products of a reduce accumulate in fp32, as
    # PopLibs' reductions do; a reduce_window's (cumsum, cumprod, pooling)
    # round every step in fp16 or bf16, as the IPU's f16 adds and XLA:CPU's
    # window loop do, so a prefix that overflowed stays infinite.
    widen = op.name != "reduce_window"
    accs = [np.dtype(np.float32) if d in HALF_FLOATS and single in ("add", "multiply") and widen else d
            for d in dtypes]
    what = single or "+".join(dict.fromkeys(i.op for i in program if i.op != "constant"))
    per_element = max(1, len(program))
    if SINGLE_STAGE and chunks == 1 and single is not None and accs[0] == dtypes[0] \
            and (not outer or _single_stage_pays(b, kept, size, xs[0].dtype, dtypes[0])):
        _single_stage(b, op, xs[0], single, _init_source(inits[0]), dtypes[0], kept, size, outer)
        return

    codelet = f"ReducePartial<{what},{dtypes[0].name}>"    # (dtype.name is slow: once here)
    if outer:
        partials = [_outer_partials(b, op, xs[0], single, codelet, chunks, size, kept, accs[0])]
    else:
        # Several chunks per output: one chunk per tile, while tiles last.
        mapping = (b.rotated(spread(b.target, kept * chunks)) if chunks > 1
                   else _spread_mapping(b, kept, size, xs[0].dtype, accs[0])
                   or b.small_linear_mapping(kept, accs[0]))
        partials = [b.tensor(f"{name_of(op)}/partials", (kept, chunks), acc, mapping) for acc in accs]
        cycles = lambda n: cost.reduce_cycles(b.target, n * size * per_element, dtypes[0])
        tiles, intervals, offsets, counts = b.by_tile(mapping)
        vertices = VertexArray(codelet, tiles, b.cycles_by_count(counts, cycles),
                               tuple((x.tensor, intervals * size, offsets) for x in xs),
                               tuple((p, intervals, offsets) for p in partials))
        kernel = (codelets.ReducePartials(xs[0], single, partials[0]) if single else
                  codelets.TreeReduce(tuple(xs), 2, program, results, None, tuple(partials)))
        b.execute(f"reduce {what} {name_of(op)} partials", kernel, vertices)

    # An outer reduction's outputs spread so that each tile combines at
    # least min_chunk partials, one output per tile when the columns of
    # partials are long (on one tile, 64 BatchNorm means received 57K
    # partials: 57K cycles of exchange).
    out_mapping = (b.rotated(TileMapping.linear(kept, b.target.num_tiles,
                                                min_elements_per_tile=-(-min_chunk // chunks)))
                   if outer else None)
    outs = [b.tensor(name_of(op), (kept,), d, out_mapping) for d in dtypes]
    init_sources = [_init_source(i) for i in inits]
    codelet = f"ReduceCombine<{what},{accs[0].name},{dtypes[0].name}>"
    tiles, intervals, offsets, counts = b.by_tile(outs[0].mapping)
    one = b.one_element(len(tiles))
    # Each output's partials: a column of the outer [chunks, kept], else a row of [kept, chunks].
    column = _outer_reads_by_tile(outs[0].mapping, chunks, kept) if outer else None
    reads = [(p, *(column if outer else (intervals * chunks, offsets))) for p in partials]
    reads += [(i.tensor, *one) for i in init_sources if isinstance(i, View)]
    vertices = VertexArray(
        codelet, tiles,
        b.cycles_by_count(counts, lambda n: cost.reduce_cycles(b.target, n * chunks * per_element, accs[0])),
        # Each partial read once, on its output's tile.
        tuple(reads), tuple((o, intervals, offsets) for o in outs),
        (ReadOnce(outs[0].mapping, 1 if outer else chunks),) * len(partials))
    kernel = (codelets.ReduceCombine(View(partials[0]), 0 if outer else 1, single, init_sources[0], outs[0])
              if single else
              codelets.TreeReduce(tuple(View(p) for p in partials), 1, program, results,
                                  tuple(init_sources), tuple(outs)))
    b.execute(f"reduce {what} {name_of(op)}", kernel, vertices)
    b.flops += kept * reduced * per_element
    for result, out in zip(op.results, outs, strict=True):
        b.values[result] = View(out).then("reshape", result.type.shape)


def _outer_partials(b: Builder, op: ir.Op, x: View, single: str, codelet: str, chunks: int, size: int,
                    kept: int, acc: np.dtype) -> Tensor:
    """Partials [chunks, kept] of x [chunks, size, kept], reduced over
    each chunk's rows: a vertex per chunk and group of columns (groups of
    at least OUTER_MIN_KEPT columns while tiles last: few rows of many
    columns), on the tile that holds the middle of its block (the
    reduction runs where the data lives, as Poplar's reductions of outer
    dimensions do), reading the block's rows (one interval when it has
    every column) and writing its part of the chunk's partials. (A vertex
    per output and chunk read a one-element interval from every row: tens
    of millions of intervals for a network's BatchNorm statistics, a third
    of its compile.)"""
    target = b.target
    groups = max(1, min(target.num_tiles // chunks, kept // OUTER_MIN_KEPT))
    width = -(-kept // groups)
    groups = -(-kept // width)
    first = np.arange(groups, dtype=np.int64) * width                       # [groups] first column
    widths = np.minimum(width, kept - first)
    j = np.arange(chunks, dtype=np.int64)[:, None]
    block = (j * size * kept + first).ravel()                               # [chunks x groups] first element
    tiles = None
    if x.is_whole_tensor:
        middle = np.minimum(block + (size // 2) * kept + np.tile(widths // 2, chunks), x.tensor.size - 1)
        source = x.tensor.mapping
        tiles = source.tiles[np.searchsorted(source.stops, middle, side="right")]
        if len(np.unique(tiles)) < min(len(tiles), target.num_tiles):
            tiles = None     # blocks across the tiles' runs (a row per tile): spread the work instead
    if tiles is None:
        tiles = (b.start_tile(chunks * groups) + np.arange(chunks * groups)) % target.num_tiles
    starts = (j * kept + first).ravel()
    partials = b.tensor(f"{name_of(op)}/partials", (chunks, kept), acc, TileMapping.from_runs(chunks * kept, tiles, starts))
    vertex_widths = np.tile(widths, chunks)
    writes = np.stack([starts, starts + vertex_widths], axis=1)
    if groups == 1:
        reads, read_offsets = np.stack([block, block + size * kept], axis=1), np.arange(chunks + 1)
    else:
        # Each row's part of the block (the cost pass reads them as Rows).
        vertices = chunks * groups
        reads = RowIntervals(block, block + vertex_widths, np.arange(vertices + 1), np.full(vertices, size, np.int64),
                             np.full(vertices, kept, np.int64))
        read_offsets = reads.offsets()
    cycles = b.cycles_by_count(vertex_widths, lambda n: cost.reduce_cycles(target, size * n, x.dtype))
    vertices = VertexArray(codelet, tiles, cycles, ((x.tensor, reads, read_offsets),),
                           ((partials, writes, np.arange(chunks * groups + 1)),))
    b.execute(f"reduce {single} {name_of(op)} partials", codelets.ReducePartials(x, single, partials, True), vertices)
    return partials


def _single_stage(b: Builder, op: ir.Op, x: View, single: str, init, dtype: np.dtype, kept: int, size: int,
                  outer: bool) -> None:
    """One partial per output: one compute set whose vertices reduce their
    outputs' elements and apply the init value, as Poplar reduces in one
    stage what fits on a tile (no partials tensor, no second compute set
    and sync). The same arithmetic in the same order as two stages (the
    partial stage's, then the init; the combine of a single partial is
    that partial). x: [kept, 1, size], or [1, size, kept] if outer."""
    out = b.tensor(name_of(op), (kept,), dtype, _spread_mapping(b, kept, size, x.dtype, dtype))
    codelet = f"Reduce<{single},{dtype.name}>"
    tiles, intervals, offsets, counts = b.by_tile(out.mapping)
    # (The cost pass reads an outer one's RowIntervals as Rows.)
    reads = [(x.tensor, *(_outer_reads_by_tile(out.mapping, size, kept) if outer else (intervals * size, offsets)))]
    if isinstance(init, View):
        reads.append((init.tensor, *b.one_element(len(tiles))))
    vertices = VertexArray(codelet, tiles,
                           b.cycles_by_count(counts, lambda n: cost.reduce_cycles(b.target, n * size, dtype)),
                           tuple(reads), ((out, intervals, offsets),))
    b.execute(f"reduce {single} {name_of(op)}", codelets.ReducePartials(x, single, out, outer, init), vertices)
    b.flops += kept * size
    b.values[op.results[0]] = View(out).then("reshape", op.results[0].type.shape)


def _single_stage_pays(b: Builder, kept: int, size: int, in_dtype: np.dtype, dtype: np.dtype) -> bool:
    """Whether one stage over leading dims beats two: its busiest tile
    receives its outputs' whole columns (size rows each), where two stages
    reduce rows where they live and add a superstep (a sync, an exchange's
    fixed cost, and receiving at least one partial per output)."""
    mapping = _spread_mapping(b, kept, size, in_dtype, dtype) or b.linear_mapping(kept, dtype)
    outputs = int((mapping.stops - mapping.starts).max(initial=0))
    rate = b.target.exchange_bytes_per_cycle
    one = -(-outputs * size * np.dtype(in_dtype).itemsize // rate)
    second = b.target.sync_cycles + b.target.exchange_fixed_cycles + -(-outputs * np.dtype(dtype).itemsize // rate)
    return one <= second


def _spread_mapping(b: Builder, kept: int, size: int, in_dtype: np.dtype, dtype: np.dtype) -> TileMapping | None:
    """The outputs of a reduction of one partial per output (`size` input
    elements each) spread so that a tile receives at most about READ_BYTES
    of input (see there); None (the default mapping) when that already
    holds."""
    default = b.linear_mapping(kept, dtype)       # (rotating it would move the next small tensor)
    per_row = size * np.dtype(in_dtype).itemsize
    if int((default.stops - default.starts).max(initial=0)) * per_row <= READ_BYTES:
        return None
    per_tile = max(1, READ_BYTES // per_row, -(-kept // b.target.num_tiles))
    return b.rotated(TileMapping.linear(kept, b.target.num_tiles, min_elements_per_tile=per_tile))
