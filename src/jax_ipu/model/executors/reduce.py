"""Executors of reductions: partials, their fixed-order combine, tree
reductions, and window selects."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.model.executors.common import REDUCE_UFUNCS, reader, register, value_reader
from jax_ipu.model.executors.elementwise import instruction
from jax_ipu.model.executors.matmul import Combined
from jax_ipu.model.fast import xla_chains

# Reductions over at most this many contiguous elements, of at least
# SHORT_AXIS_ROWS outputs, go element by element along the axis.
SHORT_AXIS = 16
SHORT_AXIS_ROWS = 256


@register(codelets.ReducePartials)
def _build_reduce_partials(k: codelets.ReducePartials):
    get, tid, ufunc, acc = reader(k.input), k.out.id, REDUCE_UFUNCS[k.op], k.out.dtype
    run = _partials_runner(k, get, ufunc, acc)
    if k.init is None:
        def partials(state):
            state[tid] = run(state)
        return partials
    # A single stage: the one partial of each output is its result, then the init.
    init = value_reader(k.init)
    shape = k.out.shape

    def single_stage(state):
        value = ufunc(init(state).astype(acc, copy=False), run(state).reshape(shape))
        state[tid] = np.asarray(value).astype(acc, copy=False).reshape(shape)
    return single_stage


def _partials_runner(k: codelets.ReducePartials, get, ufunc, acc):
    """fn(state) -> the partials [O, chunks] ([chunks, O] if outer)."""
    if k.outer and acc == np.float16 and ufunc in (np.add, np.multiply):
        def run_outer_in_order(state):
            x = get(state)
            total = x[:, 0].astype(acc)
            for i in range(1, x.shape[1]):
                ufunc(total, x[:, i], out=total)
            return total
        return run_outer_in_order
    if k.outer:
        def run_outer(state):
            # Each chunk's rows combined in order.
            return ufunc.reduce(get(state), axis=1, dtype=acc)
        return run_outer

    rows, size = k.input.shape[0] * k.input.shape[1], k.input.shape[2]
    # numpy's fp16 add and multiply reductions accumulate in fp32; an fp16
    # accumulator (a reduce_window's) rounds each step, so it goes element
    # after element.
    in_order = acc == np.float16 and ufunc in (np.add, np.multiply)
    if 1 < size and (in_order or (size <= SHORT_AXIS and rows >= SHORT_AXIS_ROWS)):
        def run_short(state):
            # Element after element into the accumulator: numpy's reduce over
            # a short contiguous axis costs 10-20x as much (a max pool's 2x2
            # windows). Combined in order, as XLA:CPU combines a window's.
            x = get(state)
            total = x[..., 0].astype(acc)      # a copy of its own
            for i in range(1, size):
                ufunc(total, x[..., i], out=total)
            return total
        return run_short

    def run(state):
        return ufunc.reduce(get(state), axis=2, dtype=acc)
    return run


def takes_combined(k: codelets.ReduceCombine) -> bool:
    """Whether this reduction sums a matmul's partials over the chunks as
    _build_matmul_combined leaves them (the only reader that can)."""
    whole = k.partials.tensor.shape
    return (k.op == "add" and k.axis == 0 and k.partials.is_whole_tensor
            and k.partials.shape == (whole[0], int(np.prod(whole[1:], dtype=np.int64))))


@register(codelets.ReduceCombine)
def _build_reduce_combine(k: codelets.ReduceCombine):
    get, tid, ufunc, axis = reader(k.partials), k.out.id, REDUCE_UFUNCS[k.op], k.axis
    init = None if k.init is None else value_reader(k.init)
    dtype, shape = k.out.dtype, k.out.shape
    acc = k.partials.dtype
    # The matmul's reduction may find its partials already combined.
    pid, may_be_combined = k.partials.tensor.id, takes_combined(k)

    def run(state):
        raw = state[pid]
        if may_be_combined and type(raw) is Combined:
            value = raw.value
        elif acc == np.float16 and ufunc in (np.add, np.multiply):    # each step rounded (see above)
            parts = np.moveaxis(get(state), axis, 0)
            value = parts[0].astype(acc)
            for part in parts[1:]:
                ufunc(value, part, out=value)
        else:
            value = ufunc.reduce(get(state), axis=axis, dtype=acc)
        if init is not None:
            value = ufunc(init(state).astype(acc, copy=False), value)
        value = np.asarray(value)
        if value.dtype != dtype:          # a float16 product's sum: XLA:CPU converts it fastest
            value = xla_chains.convert(value, dtype)
        state[tid] = value.reshape(shape)   # value is new
    return run


@register(codelets.TreeReduce)
def _build_tree_reduce(k: codelets.TreeReduce):
    readers = [reader(v) for v in k.inputs]
    dtypes = [v.dtype for v in k.inputs] * 2 + [i.dtype for i in k.body]
    steps = [(instruction(ins, dtypes)[0], ins.args) for ins in k.body]
    results = k.results
    inits = None if k.init is None else [value_reader(i) for i in k.init]
    outs = [(t.id, t.dtype, t.shape) for t in k.outs]

    def body(operands: list) -> list:
        regs = list(operands)
        for fn, args in steps:
            regs.append(fn(*[regs[a] for a in args]))
        return [regs[r] for r in results]

    def run(state):
        xs = [np.moveaxis(get(state), k.axis, 0) for get in readers]
        # Pairs neighbours (2i, 2i + 1), the earlier element first, so that
        # a body that is not commutative (argmax between two NaNs keeps its
        # first operand) sees its operands in order, as XLA:CPU's does.
        while xs[0].shape[0] > 1:
            count = xs[0].shape[0]
            half = count // 2
            combined = body([x[0:2 * half:2] for x in xs] + [x[1:2 * half:2] for x in xs])
            combined = [np.broadcast_to(c, x[:half].shape).astype(x.dtype, copy=False)
                        for c, x in zip(combined, xs)]
            xs = [np.concatenate([c, x[2 * half:]]) if count % 2 else c for c, x in zip(combined, xs)]
        values = [x[0] for x in xs]
        if inits is not None:
            values = body([init(state) for init in inits] + values)
        for (tid, dtype, shape), value in zip(outs, values):
            state[tid] = np.array(np.broadcast_to(value, shape), dtype=dtype)
    return run


@register(codelets.WindowSelect)
def _build_window_select(k: codelets.WindowSelect):
    """The scan runs over window positions, each step over all outputs at
    once, so a window's select calls are made in XLA's order. The selected
    value and position are updated by bit masks: np.where branches on
    each element and mispredicts on random data (5x slower)."""
    values, tid, slot_dtype = reader(k.values), k.out.id, k.out.dtype
    padding = reader(k.padding) if k.padding is not None else None
    window, outputs = k.values.shape
    bits = np.dtype(f"u{k.values.dtype.itemsize}")
    dtypes = [k.values.dtype] * 2 + [i.dtype for i in k.select]
    steps = [(instruction(ins, dtypes)[0], ins.args) for ins in k.select]
    result = k.result

    def keeps(selected: np.ndarray, element: np.ndarray) -> np.ndarray:
        regs = [selected, element]
        for fn, args in steps:
            regs.append(fn(*[regs[a] for a in args]))
        return regs[result]

    def run(state):
        v = values(state)
        selected = v[0].copy()
        held = selected.view(bits)
        slot = np.zeros(outputs, slot_dtype)
        if padding is not None:
            pad = padding(state)
            empty = pad[0].copy()
        for j in range(1, window):
            take = np.broadcast_to(np.logical_not(keeps(selected, v[j])), (outputs,))
            if padding is not None:      # padding is never taken, and anything replaces it
                take = (take & ~pad[j]) | empty
                empty &= pad[j]
            mask = np.negative(take.view(np.uint8).astype(bits, copy=False))   # all ones where taken
            change = np.bitwise_xor(held, v[j].view(bits))
            np.bitwise_and(change, mask, out=change)
            np.bitwise_xor(held, change, out=held)
            np.maximum(slot, np.multiply(take, j, dtype=slot_dtype), out=slot)   # later positions win
        state[tid] = slot
    return run
