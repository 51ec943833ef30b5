"""All-reduces that can run as one, made one (XLA's all-reduce combiner;
Poplar's GCL likewise sums a step's gradients in one collective): each
collective pays the IPU-Link latency and a sync once, so the gradients of
a model's many layers, reduced at the end of a step, go together. Those
with the same groups, reduction and element type whose operands all exist
where the first of them runs become one all_reduce of their flattened
operands, concatenated; each result is its slice, reshaped."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir


def combine_all_reduces(ops: list[ir.Op]) -> list[ir.Op]:
    defined_at: dict[ir.Value, int] = {}
    for i, op in enumerate(ops):
        for r in op.results:
            defined_at[r] = i
    groups: dict[tuple, list[int]] = {}
    for i, op in enumerate(ops):
        if op.name != "all_reduce" or len(op.operands) != 1:
            continue
        key = (op.attrs["replica_groups"].tobytes(), op.attrs["replica_groups"].shape,
               _body_op(op), op.operands[0].type.dtype)
        groups.setdefault(key, []).append(i)
    replace: dict[int, list[ir.Op]] = {}
    drop: set[int] = set()
    for members in groups.values():
        while len(members) > 1:
            first = members[0]
            joined = [m for m in members if defined_at.get(ops[m].operands[0], -1) < first]
            if first not in joined or len(joined) < 2:
                members = members[1:]
                continue
            replace[first] = _combined([ops[m] for m in joined])
            drop.update(joined)
            members = [m for m in members if m not in joined]
    out = []
    for i, op in enumerate(ops):
        if i in replace:
            out.extend(replace[i])
        elif i not in drop:
            out.append(op)
    return out


def _body_op(op: ir.Op) -> str:
    body = op.regions[0]
    return ",".join(inner.name for inner in body.ops)


def _combined(members: list[ir.Op]) -> list[ir.Op]:
    loc = members[0].loc
    dtype = members[0].operands[0].type.dtype
    new, flats, sizes = [], [], []
    for op in members:
        t = op.operands[0].type
        flat = ir.Value(ir.TensorType((t.size,), dtype))
        new.append(ir.Op("reshape", [op.operands[0]], [flat], {}, [], loc))
        flats.append(flat)
        sizes.append(t.size)
    total = int(np.sum(sizes))
    cat = ir.Value(ir.TensorType((total,), dtype))
    new.append(ir.Op("concatenate", flats, [cat], {"dimension": 0}, [], loc))
    summed = ir.Value(ir.TensorType((total,), dtype))
    new.append(ir.Op("all_reduce", [cat], [summed], dict(members[0].attrs), members[0].regions, loc))
    offset = 0
    for op, size in zip(members, sizes, strict=False):
        piece = ir.Value(ir.TensorType((size,), dtype))
        new.append(ir.Op("slice", [summed], [piece], {"start_indices": (offset,), "limit_indices": (offset + size,),
                                                      "strides": (1,)}, [], loc))
        new.append(ir.Op("reshape", [piece], [op.results[0]], {}, [], loc))
        offset += size
    return new
