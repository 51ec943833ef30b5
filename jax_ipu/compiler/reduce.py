"""reduce: the operand rearranged to [kept, reduced] (a Copy when that is a
layout change), partial reductions of equal chunks spread over tiles, then a
cross-tile stage combining each output's partials and the init value in a
fixed order. fp16 sums and products accumulate in fp32."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Builder, ScalarBroadcast, Splat
from jax_ipu.compiler.layout import copy_to_new, name_of
from jax_ipu.compiler.mapping import MIN_BYTES_PER_TILE, spread
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets
from jax_ipu.graph.compute import Region, Vertex
from jax_ipu.graph.views import View

# Bodies a reduction may have: their one op (applied to the two block
# arguments) names the combining function.
REDUCIBLE = {"add", "multiply", "maximum", "minimum", "and", "or", "xor"}


def _body_op(op: ir.Op) -> str:
    body = op.regions[0] if op.regions else None
    if (len(op.operands) != 2 or body is None or len(body.ops) != 1 or len(body.results) != 1
            or body.ops[0].name not in REDUCIBLE or body.results[0] is not body.ops[0].results[0]
            or set(body.ops[0].operands) != set(body.args) or len(body.args) != 2):
        what = ", ".join(o.name for o in body.ops) if body else "nothing"
        raise IpuUnimplementedError.for_op(
            op, f"reductions of {len(op.operands) // 2} operand(s) with a body of ({what}) are not "
                "supported yet (only one operand combined by add, multiply, maximum, minimum, and, "
                "or, xor)", "Rewrite the reduction (e.g. argmax as max then a masked min of iota), "
                            "or file an issue")
    return body.ops[0].name


def _chunks(reduced: int, kept: int, tiles: int, min_chunk: int) -> int:
    """How many partials per output: spread the work over idle tiles, in
    equal chunks of at least min_chunk elements."""
    if kept >= tiles or reduced <= min_chunk:
        return 1
    limit = max(1, min(tiles // max(kept, 1), reduced // min_chunk))
    return max(d for d in range(1, limit + 1) if reduced % d == 0)


def reduce(b: Builder, op: ir.Op) -> None:
    combine = _body_op(op)
    x_t, out_t = op.operands[0].type, op.results[0].type
    dims = sorted(op.attrs["dimensions"])
    kept_dims = [d for d in range(len(x_t.shape)) if d not in dims]
    kept = int(np.prod([x_t.shape[d] for d in kept_dims], dtype=np.int64))
    reduced = int(np.prod([x_t.shape[d] for d in dims], dtype=np.int64))
    init = b.values[op.operands[1]]
    if reduced == 0 or kept == 0:
        b.values[op.results[0]] = (Splat(init.value, out_t.shape) if isinstance(init, Splat)
                                   else ScalarBroadcast(init.then("reshape", ()), out_t.shape))
        return
    x = b.view(op.operands[0], name_of(op))
    order = kept_dims + dims
    if order != sorted(order):
        x = copy_to_new(b, op, x.then("transpose", tuple(order)))
    dtype = out_t.dtype
    acc = np.dtype(np.float32) if dtype == np.float16 and combine in ("add", "multiply") else dtype
    chunks = _chunks(reduced, kept, b.target.num_tiles, max(1, MIN_BYTES_PER_TILE // dtype.itemsize))
    size = reduced // chunks
    x = x.then("reshape", (kept, chunks, size))

    # Several chunks per output: one chunk per tile, while tiles last.
    partials = b.tensor(f"{name_of(op)}/partials", (kept, chunks), acc,
                        spread(b.target, kept * chunks) if chunks > 1 else None)
    vertices = []
    codelet = f"ReducePartial<{combine},{dtype.name},{acc.name}>"
    for tile in partials.mapping.tiles_used():
        intervals = partials.mapping.intervals_on(tile)
        n = int((intervals[:, 1] - intervals[:, 0]).sum())
        vertices.append(Vertex(codelet, int(tile), (Region(x.tensor, intervals * size),),
                               (Region(partials, intervals),),
                               cost.reduce_cycles(b.target, n * size, dtype)))
    b.execute(f"reduce {combine} {name_of(op)} partials", codelets.ReducePartials(x, combine, partials),
              vertices)

    out = b.tensor(name_of(op), (kept,), dtype)
    init_source = init.value if isinstance(init, Splat) else (
        init.scalar if isinstance(init, ScalarBroadcast) else init.then("reshape", ()))
    vertices = []
    codelet = f"ReduceCombine<{combine},{acc.name},{dtype.name}>"
    for tile in out.mapping.tiles_used():
        intervals = out.mapping.intervals_on(tile)
        n = int((intervals[:, 1] - intervals[:, 0]).sum())
        reads = [Region(partials, np.stack([intervals[:, 0] * chunks, intervals[:, 1] * chunks], axis=1))]
        if isinstance(init_source, View):
            reads.append(Region(init_source.tensor, np.array([[0, 1]])))
        vertices.append(Vertex(codelet, int(tile), tuple(reads), (Region(out, intervals),),
                               cost.reduce_cycles(b.target, n * chunks, acc)))
    b.execute(f"reduce {combine} {name_of(op)}",
              codelets.ReduceCombine(View(partials), 1, combine, init_source, out), vertices)
    b.flops += kept * reduced
    b.values[op.results[0]] = View(out).then("reshape", out_t.shape)


RULES = {"reduce": reduce}
