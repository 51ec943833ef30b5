"""A dot_general whose only use is a transpose swapping its operands' free
dimensions becomes the dot_general of its operands swapped, (A B)^T =
B^T A^T, when that moves fewer elements: the matmul reads its operands as
[batch, M, K] and [batch, K, N], so either form may need transposing Copies
of operands, and the first also one of its result.

JAX writes the gradient of `x @ w` with respect to `w` that way (a product,
then a transpose): swapped, the weights' gradient needs no transposing Copy
and the weight update reads it in order. The products and sums are the
same; the plan of the swapped product decides their order, as Poplar's
would."""
from __future__ import annotations

import collections
import dataclasses

from jax_ipu import ir
from jax_ipu.ir import DotDimensionNumbers


def fold_result_transposes(ops: list[ir.Op], results: list[ir.Value]) -> list[ir.Op]:
    uses = collections.Counter(results)
    _count_uses(ops, uses)
    return _fold(ops, uses)


def _count_uses(ops: list[ir.Op], uses: collections.Counter) -> None:
    for op in ops:
        uses.update(op.operands)
        for region in op.regions:
            uses.update(region.results)
            _count_uses(region.ops, uses)


def _fold(ops: list[ir.Op], uses: collections.Counter) -> list[ir.Op]:
    out: list[ir.Op] = []
    position: dict[ir.Value, int] = {}      # a single-use dot_general's result -> its index in out
    for op in ops:
        if op.regions:
            op = dataclasses.replace(op, regions=[
                dataclasses.replace(r, ops=_fold(r.ops, uses)) for r in op.regions])
        if op.name == "transpose" and op.operands[0] in position:
            index = position.pop(op.operands[0])
            swapped = _swapped(out[index], tuple(op.attrs["permutation"]), op.results[0])
            if swapped is not None:
                out[index] = swapped
                continue
        if op.name == "dot_general" and uses[op.results[0]] == 1:
            position[op.results[0]] = len(out)
        out.append(op)
    return out


def _swapped(dot: ir.Op, perm: tuple[int, ...], result: ir.Value) -> ir.Op | None:
    """dot_general(rhs, lhs) giving `result`, if transposing dot's result by
    `perm` swaps its lhs and rhs free dimensions; else None."""
    dims: DotDimensionNumbers = dot.attrs["dot_dimension_numbers"]
    lhs_rank, rhs_rank = (len(v.type.shape) for v in dot.operands)
    batch = len(dims.lhs_batching_dimensions)
    lhs_free = lhs_rank - batch - len(dims.lhs_contracting_dimensions)
    rhs_free = rhs_rank - batch - len(dims.rhs_contracting_dimensions)
    wanted = (tuple(range(batch)) + tuple(range(batch + lhs_free, batch + lhs_free + rhs_free))
              + tuple(range(batch, batch + lhs_free)))
    if perm != wanted or lhs_free == 0 or rhs_free == 0:
        return None
    lhs, rhs = dot.operands
    lb, lc = dims.lhs_batching_dimensions, dims.lhs_contracting_dimensions
    rb, rc = dims.rhs_batching_dimensions, dims.rhs_contracting_dimensions
    as_is = (_copied(lhs, lb, lc, contracting_last=True) + _copied(rhs, rb, rc, contracting_last=False)
             + _size(result))
    swapped = _copied(rhs, rb, rc, contracting_last=True) + _copied(lhs, lb, lc, contracting_last=False)
    if swapped >= as_is:
        return None
    attrs = dict(dot.attrs)
    attrs["dot_dimension_numbers"] = DotDimensionNumbers(
        lhs_batching_dimensions=dims.rhs_batching_dimensions,
        rhs_batching_dimensions=dims.lhs_batching_dimensions,
        lhs_contracting_dimensions=dims.rhs_contracting_dimensions,
        rhs_contracting_dimensions=dims.lhs_contracting_dimensions)
    if isinstance(attrs.get("precision_config"), (list, tuple)) and len(attrs["precision_config"]) == 2:
        attrs["precision_config"] = type(attrs["precision_config"])(reversed(attrs["precision_config"]))
    return dataclasses.replace(dot, operands=list(reversed(dot.operands)), results=[result], attrs=attrs)


def _size(value: ir.Value) -> int:
    size = 1
    for d in value.type.shape:
        size *= d
    return size


def _copied(operand: ir.Value, batch, contracting, contracting_last: bool) -> int:
    """Elements of `operand` a transposing Copy moves to read it as a
    matmul's lhs ([batch, free, contracting]) or rhs ([batch, contracting, free])."""
    free = [d for d in range(len(operand.type.shape)) if d not in batch and d not in contracting]
    order = list(batch) + (free + list(contracting) if contracting_last else list(contracting) + free)
    return 0 if order == sorted(order) else _size(operand)
