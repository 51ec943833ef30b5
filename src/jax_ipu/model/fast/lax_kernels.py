"""The kernels' reference semantics in jax.lax, for loops run as one
XLA:CPU executable (model/fast/loops.py): each translation computes what
the kernel's reference executor (model/executors/) computes, from the
kernel's record, and is registered beside it (registry.traced). A kernel
without one, or one a translation declines (Untranslatable), keeps its
loop on the engine's own steps.

The values are the reference's bits, with three documented exceptions
(model-speed.md, "Loops"): transcendental functions are XLA:CPU's, float
sums and products over an axis (reductions, a K-chunk's dot product) are
added in XLA's order rather than numpy's pairwise one, and XLA:CPU
flushes float32 subnormals to zero. Everything else is kept bit for bit:

- every float op's result passes through an identity XLA cannot see
  through (its bits xor'ed with a run-time zero, `Trace.opaque`), so that
  it is rounded to its type before the next op reads it: XLA would
  otherwise contract a multiply into the add that reads it (one rounding
  where numpy makes two), keep float16 intermediates in float32, or
  rewrite ops by algebra that is not IEEE's (x + 0 to x, exp(a) * exp(b)
  to exp(a + b));
- float immediates pass through it too (XLA divides by a constant as a
  product with its reciprocal);
- XLA's semantics are the ones the numpy executors imitate anyway:
  clamped dynamic slices and gathers, scatters that skip windows out of
  bounds and combine duplicates in order, saturating float-to-int
  conversion, integer division by zero."""
from __future__ import annotations

import math

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.graph import codelets_collectives as cc
from jax_ipu.graph import codelets_indexing as ci
from jax_ipu.graph.records import is_immediate
from jax_ipu.graph.views import Concat, View, apply_ops
from jax_ipu.model.executors.conv import products_dtype
from jax_ipu.model.fast.matmul import takes_combined
from jax_ipu.model.registry import traced
from jax_ipu.ops import OPS

# The element types a translation takes: the IPU's. (A kernel of any other
# type stays on the engine.)
DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float16, np.int32, np.uint32, np.int16, np.uint16,
                                         np.int8, np.uint8, np.bool_))


class Untranslatable(Exception):
    """A kernel (or step) the loop's executable cannot compute as its
    reference does: the loop runs on the engine's steps instead."""


class Trace:
    """What a translation reads, writes and computes with while a loop's
    executable is traced: `env` holds each tensor's current value (a jax
    array of the tensor's shape), `zero` a run-time uint32 zero, `indices`
    the run's replica and partition indices (run-time uint32 scalars by
    name, as ReplicaIndex names them)."""

    def __init__(self, jax, env: dict, zero, stand_ins=frozenset(), indices=None):
        self.jax, self.lax, self.jnp = jax, jax.lax, jax.numpy
        self.env, self.zero, self.stand_ins, self.indices = env, zero, stand_ins, indices or {}

    # -- values

    def tensor(self, tensor):
        value = self.env.get(tensor.id)
        if value is None:
            raise Untranslatable(f"tensor {tensor.name} is read before any value reaches it")
        return value

    def read(self, source):
        """The value of a view, a concatenation, or an immediate (opaque)."""
        if isinstance(source, Concat):
            return self.lax.concatenate([self.read(p) for p in source.parts], source.axis)
        if isinstance(source, View):
            check_dtype(source.dtype)
            return self.view(self.tensor(source.tensor), source.ops)
        if is_immediate(source):
            return self.constant(np.asarray(source))
        raise Untranslatable(f"a kernel reads a {type(source).__name__}")

    def constant(self, array: np.ndarray):
        check_dtype(array.dtype)
        return self.opaque(self.jnp.asarray(array, dtype=array.dtype))

    def write(self, tensor, value) -> None:
        check_dtype(tensor.dtype)
        if value.dtype != tensor.dtype:
            value = self.lax.convert_element_type(value, tensor.dtype)
        self.env[tensor.id] = self.lax.reshape(value, tuple(tensor.shape)) if value.shape != tuple(tensor.shape) \
            else value

    def opaque(self, value, like=None):
        """A float value through an identity XLA cannot see through (see
        the module's docstring); other values as they are. `like`, a value
        of the same shape and type: the zero xor'ed in is made from its
        bits (a value XLA cannot take for a broadcast, as it could take a
        broadcast value xor'ed with a broadcast zero)."""
        dtype = np.dtype(value.dtype)
        if dtype.kind != "f":
            return value
        bits = {2: np.uint16, 4: np.uint32}[dtype.itemsize]
        lax = self.lax
        zero = self.zero.astype(bits)
        if like is not None and value.ndim:
            zero = lax.bitwise_and(lax.bitcast_convert_type(like, bits), self.broadcast(zero, tuple(value.shape)))
        flipped = lax.bitwise_xor(lax.bitcast_convert_type(value, bits), zero)
        return lax.bitcast_convert_type(flipped, dtype)

    def broadcast(self, value, shape: tuple):
        shape = tuple(shape)
        if value.shape == shape:
            return value
        lead = len(shape) - value.ndim
        kept = tuple(i + lead for i, n in enumerate(value.shape) if n == shape[i + lead])
        squeezed = self.lax.reshape(value, tuple(value.shape[i - lead] for i in kept))
        return self.lax.broadcast_in_dim(squeezed, shape, kept)

    # -- view ops

    def view(self, value, ops: tuple):
        lax = self.lax
        for op in ops:
            kind = op[0]
            if kind == "reshape":
                value = lax.reshape(value, tuple(op[1]))
            elif kind == "transpose":
                value = lax.transpose(value, tuple(op[1]))
            elif kind == "slice":
                starts, limits, strides = op[1:]
                if any(s <= 0 for s in strides):
                    raise Untranslatable("a slice of negative stride")
                value = lax.slice(value, tuple(starts), tuple(max(a, b) for a, b in zip(starts, limits, strict=True)),
                                  tuple(strides))
            elif kind == "broadcast":
                value = lax.broadcast_in_dim(value, tuple(op[1]), tuple(op[2]))
            elif kind in ("gather", "windows"):
                value = self._rearranged(value, op)
            else:
                raise Untranslatable(f"a view op {kind}")
        return value

    def _rearranged(self, value, op):
        """A gather or windows view op: its flat indices into the value,
        found once by applying the op to positions (padding: -1, read as
        the op's fill)."""
        fill = op[-1]
        positions = np.arange(math.prod(value.shape), dtype=np.int64).reshape(value.shape)
        index = apply_ops(positions, ((*op[:-1], np.int64(-1)),) if fill is not None else (op,))
        index = np.ascontiguousarray(index)
        flat = self.lax.reshape(value, (positions.size,))
        if fill is not None and (index < 0).any():
            flat = self.lax.concatenate([flat, self.constant(np.asarray([fill], dtype=value.dtype))], 0)
            index = np.where(index < 0, positions.size, index)
        taken = self.jnp.take(flat, self.jnp.asarray(index.reshape(-1).astype(np.int32)), mode="clip")
        return self.lax.reshape(taken, index.shape)

    # -- element-wise ops

    def instruction(self, ins: codelets.Instruction, operands: list):
        """One op of a chain or body program, its result rounded to its type."""
        lax, attrs = self.lax, dict(ins.attrs)
        check_dtype(ins.dtype)
        if ins.op == "constant":
            return self.constant(np.asarray(attrs["value"], ins.dtype))
        if any(np.ndim(a) for a in operands):
            shape = np.broadcast_shapes(*(tuple(a.shape) for a in operands))
            operands = [self.broadcast(a, shape) for a in operands]
        if ins.op == "divide":
            # XLA divides by a broadcast value (a scalar's, or a view's
            # broadcast) as a product with its reciprocal: the divisor is
            # made a value of the full shape.
            operands[1] = self.opaque(operands[1], like=operands[0])
        if ins.op == "convert":
            value = lax.convert_element_type(operands[0], ins.dtype)
        elif ins.op == "bitcast_convert":
            value = lax.bitcast_convert_type(operands[0], ins.dtype)
        elif ins.op == "compare" and attrs.get("compare_type") == "TOTALORDER" \
                and np.dtype(operands[0].dtype).kind == "f":
            value = OPS["compare"].lax(lax)(*[self._total_order_key(a) for a in operands],
                                          comparison_direction=attrs["comparison_direction"])
        elif ins.op == "compare":
            value = OPS["compare"].lax(lax)(*operands, comparison_direction=attrs["comparison_direction"])
        elif ins.op == "reduce_precision":
            value = OPS[ins.op].lax(lax)(*operands, **attrs)
        elif ins.op in OPS and not attrs:
            value = OPS[ins.op].lax(lax)(*operands)
        else:
            raise Untranslatable(f"the element-wise op {ins.op}")
        if np.dtype(value.dtype) != ins.dtype:
            raise Untranslatable(f"{ins.op} gives {value.dtype} where the kernel says {ins.dtype}")
        return self.opaque(value)

    def _total_order_key(self, value):
        """Floats as signed integers ordered as IEEE totalOrder (ops.total_order_key)."""
        lax = self.lax
        signed = {2: np.int16, 4: np.int32}[np.dtype(value.dtype).itemsize]
        bits = lax.bitcast_convert_type(value, signed)
        mask = self.jnp.asarray(np.iinfo(signed).max, dtype=signed)
        return lax.select(bits < 0, lax.bitwise_xor(bits, self.broadcast(mask, bits.shape)), bits)

    def program(self, body, registers: list) -> list:
        """A body program (a reduction's, a scatter's, a comparator's) on
        its registers: the registers with every instruction's result."""
        regs = list(registers)
        for ins in body:
            regs.append(self.instruction(ins, [regs[a] for a in ins.args]))
        return regs


def check_dtype(dtype) -> None:
    if np.dtype(dtype) not in DTYPES:
        raise Untranslatable(f"the element type {np.dtype(dtype)}")


# -- element-wise kernels


@traced(codelets.ElementwiseChain)
def _chain(k: codelets.ElementwiseChain, t: Trace) -> None:
    regs = t.program(k.instructions, [t.read(s) for s in k.inputs])
    for reg, tensor in k.outputs:
        t.write(tensor, t.broadcast(regs[reg], tuple(k.shape)))


@traced(codelets.Fill)
def _fill(k: codelets.Fill, t: Trace) -> None:
    t.write(k.out, t.broadcast(t.constant(np.asarray(k.value)), tuple(k.out.shape)))


@traced(cc.ReplicaIndex)
def _replica_index(k: cc.ReplicaIndex, t: Trace) -> None:
    if k.which not in t.indices:
        raise Untranslatable(f"the {k.which} index")
    t.write(k.out, t.indices[k.which])


# -- products and reductions


@traced(codelets.MatMulPartials)
def _matmul_partials(k: codelets.MatMulPartials, t: Trace) -> None:
    """Each K-chunk's product, the operands converted to the partials'
    type first (float16 operands' products are exact in float32). When
    only the matmul's own reduction reads the partials (a fusion's
    stand-in, model/fast/matmul.py), they are left summed: one product
    over the whole of K, [batch * m * n], which that reduction takes."""
    lax, acc = t.lax, k.out.dtype
    dot = products_dtype(acc)       # float16 partials: each chunk's float32 sum rounded once
    chunks, batch, m, n = k.out.shape
    size = k.lhs.shape[2] // chunks if chunks else 0
    lhs = lax.convert_element_type(t.read(k.lhs), dot)
    rhs = lax.convert_element_type(t.read(k.rhs), dot)
    if chunks == 0 or size == 0:
        t.write(k.out, t.broadcast(t.constant(np.zeros((), acc)), tuple(k.out.shape)))
        return
    lhs = lax.slice_in_dim(lhs, 0, chunks * size, axis=2)
    rhs = lax.slice_in_dim(rhs, 0, chunks * size, axis=1)
    if k.out.id in t.stand_ins:
        summed = lax.dot_general(lhs, rhs, (((2,), (1,)), ((0,), (0,))), precision=lax.Precision.HIGHEST,
                                 preferred_element_type=dot)
        t.env[k.out.id] = t.opaque(lax.reshape(summed, (batch * m * n,)))
        return
    lhs = lax.transpose(lax.reshape(lhs, (batch, m, chunks, size)), (2, 0, 1, 3))      # [c, B, M, s]
    rhs = lax.transpose(lax.reshape(rhs, (batch, chunks, size, n)), (1, 0, 2, 3))      # [c, B, s, N]
    out = lax.dot_general(lhs, rhs, (((3,), (2,)), ((0, 1), (0, 1))), precision=lax.Precision.HIGHEST,
                          preferred_element_type=dot)
    t.write(k.out, t.opaque(lax.convert_element_type(out, acc)))


# Reduction ops as jax.lax's binary functions and its reductions over axes.
_LAX_COMBINE = {"add": "add", "multiply": "mul", "maximum": "max", "minimum": "min",
                "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor"}
_LAX_REDUCE = {"add": "reduce_sum", "multiply": "reduce_prod", "maximum": "reduce_max", "minimum": "reduce_min",
               "and": "reduce_and", "or": "reduce_or", "xor": "reduce_xor"}
# Axes up to this long are reduced one element after another, unrolled.
UNROLLED_AXIS = 64


def _combine(t: Trace, op: str, a, b):
    return t.opaque(getattr(t.lax, _LAX_COMBINE[op])(a, b))


def _reduced(t: Trace, op: str, x, axis: int, acc):
    """x reduced by `op` over `axis` in `acc`. Integers, max and min give
    the same bits in any order; a float16 sum or product rounds each step
    in float16, element after element, as the reference's; other float
    sums and products are XLA's over long axes and one element after
    another over short ones (numpy's pairwise order differs from either
    beyond eight elements)."""
    lax = t.lax
    x = lax.convert_element_type(x, acc)
    n = x.shape[axis]
    stepwise = np.dtype(acc) == np.float16 and op in ("add", "multiply")
    if n == 0:
        shape = tuple(s for i, s in enumerate(x.shape) if i != axis)
        return t.opaque(getattr(lax, _LAX_REDUCE[op])(lax.reshape(x, (*shape, 0)), (len(shape),)))
    if n <= UNROLLED_AXIS:
        total = lax.index_in_dim(x, 0, axis, keepdims=False)
        for i in range(1, n):
            total = _combine(t, op, total, lax.index_in_dim(x, i, axis, keepdims=False))
        return total
    if stepwise:
        rows = lax.transpose(x, (axis, *[d for d in range(x.ndim) if d != axis]))
        return lax.fori_loop(1, n, lambda i, total: _combine(t, op, total, lax.dynamic_index_in_dim(
            rows, i, 0, keepdims=False)), lax.index_in_dim(rows, 0, 0, keepdims=False))
    return t.opaque(getattr(lax, _LAX_REDUCE[op])(x, (axis,)))


@traced(codelets.ReducePartials)
def _reduce_partials(k: codelets.ReducePartials, t: Trace) -> None:
    value = _reduced(t, k.op, t.read(k.input), 1 if k.outer else 2, k.out.dtype)
    if k.init is not None:
        init = t.lax.convert_element_type(t.read(k.init), k.out.dtype)
        value = _combine(t, k.op, t.broadcast(init, tuple(k.out.shape)), t.lax.reshape(value, tuple(k.out.shape)))
    t.write(k.out, value)


@traced(codelets.ReduceCombine)
def _reduce_combine(k: codelets.ReduceCombine, t: Trace) -> None:
    acc = k.partials.dtype
    if k.partials.tensor.id in t.stand_ins and takes_combined(k):
        value = t.lax.reshape(t.tensor(k.partials.tensor), tuple(k.partials.shape[1:]))    # summed already
    else:
        value = _reduced(t, k.op, t.read(k.partials), k.axis, acc)
    if k.init is not None:
        init = t.lax.convert_element_type(t.read(k.init), acc)
        value = _combine(t, k.op, t.broadcast(init, tuple(value.shape)), value)
    t.write(k.out, t.opaque(t.lax.convert_element_type(value, k.out.dtype)))


@traced(codelets.TreeReduce)
def _tree_reduce(k: codelets.TreeReduce, t: Trace) -> None:
    """Neighbours (2i, 2i + 1) paired level by level, as the reference does."""
    lax = t.lax
    xs = [t.read(v) for v in k.inputs]
    xs = [lax.transpose(x, (k.axis, *[d for d in range(x.ndim) if d != k.axis])) for x in xs]

    def body(operands):
        regs = t.program(k.body, operands)
        return [regs[r] for r in k.results]
    while xs[0].shape[0] > 1:
        count = xs[0].shape[0]
        half = count // 2
        evens = [lax.slice_in_dim(x, 0, 2 * half, 2, 0) for x in xs]
        odds = [lax.slice_in_dim(x, 1, 2 * half, 2, 0) for x in xs]
        combined = [lax.convert_element_type(t.broadcast(c, tuple(e.shape)), e.dtype)
                    for c, e in zip(body(evens + odds), evens, strict=True)]
        xs = [lax.concatenate([c, lax.slice_in_dim(x, 2 * half, count, 1, 0)], 0) if count % 2 else c
              for c, x in zip(combined, xs, strict=True)]
    if xs[0].shape[0] == 0:
        raise Untranslatable("a tree reduction of nothing")
    values = [lax.index_in_dim(x, 0, 0, keepdims=False) for x in xs]
    if k.init is not None:
        values = body([t.read(i) for i in k.init] + values)
    for out, value in zip(k.outs, values, strict=True):
        t.write(out, t.broadcast(lax.convert_element_type(value, out.dtype), tuple(out.shape)))


# -- indexing


def _start(t: Trace, source, dim: int, size: int):
    """A dynamic slice's start, clamped into [0, dim - size] as XLA (and
    the reference) clamp it, as int32."""
    lax = t.lax
    last = dim - size
    if not isinstance(source, View):
        start = int(np.asarray(source).reshape(()))
        return np.int32(min(max(start, 0), last))
    value = lax.reshape(t.read(source), ())
    dtype = np.dtype(value.dtype)
    if dtype.kind not in "iu":
        raise Untranslatable(f"a start of type {dtype}")
    info = np.iinfo(dtype)
    if last <= info.max:
        value = lax.min(value, t.jnp.asarray(last, dtype))
    if dtype.kind == "i":
        value = lax.max(value, t.jnp.asarray(0, dtype))
    return lax.convert_element_type(value, np.int32)


@traced(ci.DynamicSlice)
def _dynamic_slice(k: ci.DynamicSlice, t: Trace) -> None:
    operand = t.read(k.operand)
    starts = [_start(t, s, d, n) for s, d, n in zip(k.starts, k.operand.shape, k.out.shape, strict=True)]
    t.write(k.out, t.lax.dynamic_slice(operand, starts, tuple(k.out.shape)))


@traced(ci.DynamicUpdateSlice)
def _dynamic_update_slice(k: ci.DynamicUpdateSlice, t: Trace) -> None:
    operand = t.read(k.operand)
    update = t.lax.convert_element_type(t.read(k.update), operand.dtype)
    starts = [_start(t, s, d, n) for s, d, n in zip(k.starts, k.operand.shape, k.update.shape, strict=True)]
    t.write(k.out, t.lax.dynamic_update_slice(operand, update, starts))


def _indices_last(t: Trace, indices, index_vector_dim: int):
    """Indices with their index vectors on the last axis (jax's form)."""
    if index_vector_dim == indices.ndim:
        return t.lax.expand_dims(indices, (indices.ndim,)), list(range(indices.ndim))
    order = [d for d in range(indices.ndim) if d != index_vector_dim]
    return t.lax.transpose(indices, (*order, index_vector_dim)), order


@traced(ci.Gather)
def _gather(k: ci.Gather, t: Trace) -> None:
    lax = t.lax
    dn = k.dimension_numbers
    indices, order = _indices_last(t, t.read(k.indices), dn.index_vector_dim)
    numbers = lax.GatherDimensionNumbers(
        offset_dims=tuple(dn.offset_dims), collapsed_slice_dims=tuple(dn.collapsed_slice_dims),
        start_index_map=tuple(dn.start_index_map), operand_batching_dims=tuple(dn.operand_batching_dims),
        start_indices_batching_dims=tuple(order.index(d) for d in dn.start_indices_batching_dims))
    out = lax.gather(t.read(k.operand), indices, numbers, tuple(k.slice_sizes),
                     mode=lax.GatherScatterMode.CLIP)
    t.write(k.out, out)


_SCATTERS = {"replace": "scatter", "add": "scatter_add", "multiply": "scatter_mul", "maximum": "scatter_max",
             "minimum": "scatter_min"}


@traced(ci.Scatter)
def _scatter(k: ci.Scatter, t: Trace) -> None:
    if k.combiner not in _SCATTERS or len(k.operands) != 1:
        raise Untranslatable("a scatter with a body program or several operands")
    lax = t.lax
    dn = k.dimension_numbers
    indices, order = _indices_last(t, t.read(k.indices), dn.index_vector_dim)
    numbers = lax.ScatterDimensionNumbers(
        update_window_dims=tuple(dn.update_window_dims), inserted_window_dims=tuple(dn.inserted_window_dims),
        scatter_dims_to_operand_dims=tuple(dn.scatter_dims_to_operand_dims),
        operand_batching_dims=tuple(dn.input_batching_dims),
        scatter_indices_batching_dims=tuple(order.index(d) for d in dn.scatter_indices_batching_dims))
    operand = t.read(k.operands[0])
    updates = lax.convert_element_type(t.read(k.updates[0]), operand.dtype)
    out = getattr(lax, _SCATTERS[k.combiner])(operand, indices, updates, numbers,
                                              mode=lax.GatherScatterMode.FILL_OR_DROP)
    t.write(k.outs[0], out)       # in place in the loop: no pass over the buffer (opaque would make one)
