"""Dense linear algebra: stablehlo.cholesky and triangular_solve, and the
custom_calls JAX's generic lowerings emit (geqrf's "Qr",
"ProductOfElementaryHouseholderReflectors") or jax_ipu.frontend.jax_rules registers
for the ipu platform ("jax_ipu.lu", "jax_ipu.eigh", "jax_ipu.svd",
"jax_ipu.tridiagonal", "jax_ipu.eig"). Each
becomes one compute set (a Factorize kernel): small matrices whole on a
tile, one vertex per tile factoring its matrices; a large matrix spread
in blocks of consecutive elements (rows) over several tiles, as PopLin lays
out a matrix being factorised, one vertex per tile updating its block, and
the pivot rows broadcast to the matrix's tiles, a panel a round of exchange
and sync, within a bounded buffer."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder
from jax_ipu.compiler.lowering.layout import name_of
from jax_ipu.compiler.lowering.registry import register, register_custom_call
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph.codelets_linalg import Factorize
from jax_ipu.graph.compute import DataDependentExchange, Region, Vertex
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.views import View


def _matrix_elements(t: ir.TensorType, batch_rank: int) -> int:
    return int(np.prod(t.shape[batch_rank:], dtype=np.int64))


def _factorize(b: Builder, op: ir.Op, kind: str, attrs: dict, flops_per_matrix: float) -> None:
    for v in op.operands:
        if v.type.dtype not in (np.float32, np.complex64):
            raise IpuUnimplementedError.for_op(op, f"{kind} of {v.type} is not supported (float32 and complex64 "
                                               "only)", "Cast the operand to float32 or complex64")
    if any(v.type.dtype == np.complex64 for v in op.operands):
        flops_per_matrix *= 4       # a complex multiply-add is four real ones
    a_t = op.operands[0].type
    batch_rank = len(a_t.shape) - 2
    count = int(np.prod(a_t.shape[:batch_rank], dtype=np.int64))
    tiles = b.target.num_tiles
    per_tile = max(1, -(-count // tiles))
    matrix_bytes = sum(_matrix_elements(v.type, batch_rank) * v.type.dtype.itemsize
                       for v in list(op.operands) + list(op.results))
    spread = min(max(1, tiles // max(count, 1)), -(-matrix_bytes // int(SPREAD_SHARE * b.target.bytes_per_tile)))
    if per_tile == 1 and spread > 1:
        _factorize_spread(b, op, kind, attrs, flops_per_matrix, batch_rank, count, spread)
        return
    outs = []
    for r in op.results:
        elements = _matrix_elements(r.type, batch_rank)
        mapping = TileMapping.linear(r.type.size, tiles, grain=max(1, elements * per_tile)) if r.type.size \
            else None
        outs.append(b.tensor(f"{name_of(op)}/{len(outs)}", r.type.shape, r.type.dtype, mapping))
    inputs = [b.view(v, name_of(op)) for v in op.operands]
    sizes_in = [_matrix_elements(v.type, batch_rank) for v in op.operands]
    sizes_out = [_matrix_elements(r.type, batch_rank) for r in op.results]
    vertices = []
    for first in range(0, count, per_tile):
        last = min(count, first + per_tile)
        tile = (first // per_tile) % tiles

        def region(t, e, first=first, last=last):
            return Region(t, np.array([[first * e, last * e]]))
        cycles = cost.worker_cycles(b.target, int(flops_per_matrix * (last - first)), 1,
                                    b.target.vector_width(np.dtype(np.float32)))
        vertices.append(Vertex(f"{kind}<float>", int(tile), tuple(region(v.tensor, e) for v, e in zip(inputs, sizes_in, strict=True)),
                               tuple(region(t, e) for t, e in zip(outs, sizes_out, strict=True) if e),
                               b.target.supervisor_cycles + cycles))
    b.execute(f"{kind} {name_of(op)}", Factorize(kind, tuple(inputs), tuple(outs), tuple(sorted(attrs.items()))),
              vertices)
    b.flops += flops_per_matrix * count
    for r, t in zip(op.results, outs, strict=True):
        b.values[r] = View(t)


# A matrix whose operands and results take more than this share of a tile
# is spread over several tiles.
SPREAD_SHARE = 0.125
# Pivot rows broadcast per round of a spread factorisation, within a
# buffer of at most this share of a tile.
PANEL_ROWS = 16
PANEL_SHARE = 0.1


def _blocks(t: ir.TensorType, batch_rank: int, count: int, spread: int) -> np.ndarray:
    """The tile of each element of a result or operand spread with its
    matrix: matrix i on tiles i*spread .. i*spread + spread - 1, its
    elements (row after row) cut in `spread` consecutive blocks."""
    per_matrix = int(np.prod(t.shape[batch_rank:], dtype=np.int64))
    block = max(1, -(-per_matrix // spread))
    within = np.arange(per_matrix) // block
    return (np.arange(count)[:, None] * spread + within[None, :]).ravel()


def _factorize_spread(b: Builder, op: ir.Op, kind: str, attrs: dict, flops_per_matrix: float,
                      batch_rank: int, count: int, spread: int) -> None:
    tiles = b.target.num_tiles
    outs, out_tiles = [], []
    for r in op.results:
        element_tiles = _blocks(r.type, batch_rank, count, spread) % tiles
        out_tiles.append(element_tiles)
        mapping = TileMapping.from_element_tiles(element_tiles) if r.type.size else None
        outs.append(b.tensor(f"{name_of(op)}/{len(outs)}", r.type.shape, r.type.dtype, mapping))
    inputs = [b.view(v, name_of(op)) for v in op.operands]
    in_tiles = [_blocks(v.type, batch_rank, count, spread) % tiles for v in op.operands]
    m, n = op.operands[0].type.shape[-2:]
    cycles = cost.worker_cycles(b.target, int(flops_per_matrix / spread), 1,
                                b.target.vector_width(np.dtype(np.float32)))
    vertices = []
    for tile in np.unique(np.concatenate(out_tiles + in_tiles)):
        reads = tuple(Region(v.tensor, _intervals(t == tile)) for v, t in zip(inputs, in_tiles, strict=True) if (t == tile).any())
        writes = tuple(Region(o, _intervals(t == tile)) for o, t in zip(outs, out_tiles, strict=True) if (t == tile).any())
        vertices.append(Vertex(f"{kind}<float>", int(tile), reads, writes, b.target.supervisor_cycles + cycles))
    # Exchange: each tile first receives its block of the operands, then
    # every pivot row of its matrix, a panel of rows (or what fits its
    # buffer) a round.
    row_bytes = int(n) * op.operands[0].type.dtype.itemsize
    pivot_bytes = min(m, n) * row_bytes
    buffer = max(1, min(PANEL_ROWS * row_bytes, int(PANEL_SHARE * b.target.bytes_per_tile)))
    rounds = max(1, -(-pivot_bytes // buffer))
    held = np.zeros(tiles, dtype=np.int64)
    for v, t in zip(op.operands, in_tiles, strict=True):
        held += np.bincount(t, minlength=tiles) * v.type.dtype.itemsize
    on_matrix_tiles = np.bincount(np.concatenate(in_tiles), minlength=tiles) > 0
    panel = np.where(on_matrix_tiles, buffer, 0)
    received = held + np.where(on_matrix_tiles, pivot_bytes, 0)
    # A pivot row is sent once (multicast) by the tile holding it.
    sent = held + np.where(on_matrix_tiles, -(-count * pivot_bytes // max(int(on_matrix_tiles.sum()), 1)), 0)
    b.execute(f"{kind} {name_of(op)} over {spread} tiles a matrix",
              Factorize(kind, tuple(inputs), tuple(outs), tuple(sorted(attrs.items()))), vertices,
              DataDependentExchange(rounds, sent, received, held + panel))
    b.flops += flops_per_matrix * count
    for r, t in zip(op.results, outs, strict=True):
        b.values[r] = View(t)


def _intervals(mask: np.ndarray) -> np.ndarray:
    """[k, 2] runs of True in mask."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return edges.reshape(-1, 2)


@register("cholesky")
def cholesky(b: Builder, op: ir.Op) -> None:
    n = op.operands[0].type.shape[-1]
    _factorize(b, op, "cholesky", {"lower": bool(op.attrs.get("lower", False))}, n ** 3 / 3)


@register("triangular_solve")
def triangular_solve(b: Builder, op: ir.Op) -> None:
    a_t, b_t = op.operands[0].type, op.operands[1].type
    n, rhs = a_t.shape[-1], b_t.shape[-1] * b_t.shape[-2] // max(a_t.shape[-1], 1)
    attrs = {"left_side": bool(op.attrs.get("left_side", False)), "lower": bool(op.attrs.get("lower", False)),
             "unit_diagonal": bool(op.attrs.get("unit_diagonal", False)),
             "transpose_a": str(op.attrs.get("transpose_a", "NO_TRANSPOSE"))}
    _factorize(b, op, "triangular_solve", attrs, float(n * n * rhs))


def _options(target: str) -> tuple[str, dict]:
    """"jax_ipu.svd:full_matrices=1,compute_uv=0" -> ("svd", {...})."""
    name, _, options = target.partition(":")
    attrs = {k: bool(int(v)) for k, v in (o.split("=") for o in options.split(",") if o)}
    return name.removeprefix("jax_ipu."), attrs


@register_custom_call("Qr", "ProductOfElementaryHouseholderReflectors", "jax_ipu.lu", "jax_ipu.eigh",
                      "jax_ipu.svd", "jax_ipu.tridiagonal", "jax_ipu.eig")
def factorization(b: Builder, op: ir.Op) -> None:
    """JAX's generic QR calls and jax-ipu's own decompositions
    ("jax_ipu.svd:full_matrices=1,compute_uv=0": options after ':')."""
    target = str(op.attrs.get("call_target_name"))
    shape = op.operands[0].type.shape if op.operands else (0, 0)
    m, n = (shape[-2], shape[-1]) if len(shape) >= 2 else (0, 0)
    if target == "Qr":
        _factorize(b, op, "qr", {}, 2.0 * m * n * n)
    elif target == "ProductOfElementaryHouseholderReflectors":
        _factorize(b, op, "householder", {}, 2.0 * m * n * n)
    else:
        kind, attrs = _options(target)
        flops = {"lu": 2 * m * n * n / 3, "eigh": 9.0 * n ** 3, "tridiagonal": 4 * n ** 3 / 3, "eig": 25.0 * n ** 3}
        _factorize(b, op, kind, attrs, flops.get(kind, 12.0 * m * n * n))
