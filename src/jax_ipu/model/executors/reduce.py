"""Reference executors of reductions: partials, their fixed-order combine,
tree reductions, and window selects. A float16 (or bfloat16) sum or
product rounds each step, so it is made element after element in order
(numpy's own float16 reductions accumulate in float32); any other
reduction is numpy's reduce of the chunk."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.model.executors.elementwise import instruction
from jax_ipu.model.registry import reference
from jax_ipu.ops import REDUCE_OPS
from jax_ipu.targets import BFLOAT16


def rounds_each_step(ufunc: np.ufunc, acc: np.dtype) -> bool:
    """Whether a reduction into `acc` is made element after element (a
    float16 or bfloat16 sum or product; bfloat16's ufuncs compute each
    step in float32 and round it)."""
    return acc in (np.float16, BFLOAT16) and ufunc in (np.add, np.multiply)


def reduced(ufunc: np.ufunc, x: np.ndarray, axis: int, acc: np.dtype) -> np.ndarray:
    """x reduced by ufunc over `axis`, accumulated in `acc`."""
    if rounds_each_step(ufunc, acc) and x.shape[axis]:
        parts = np.moveaxis(x, axis, 0)
        total = parts[0].astype(acc)        # a copy of its own
        for part in parts[1:]:
            ufunc(total, part, out=total)
        return total
    return ufunc.reduce(x, axis=axis, dtype=acc)


@reference(codelets.ReducePartials)
def reduce_partials(k: codelets.ReducePartials, read, partials: Callable | None = None):
    """The partials [O, chunks] ([chunks, O] if outer), or with `init` the
    reduction's result [O]. partials: fn(state) -> the partials, when a
    faster way to make them is given (model/fast/reduce.py)."""
    get, tid, ufunc, acc = read(k.input), k.out.id, REDUCE_OPS[k.op], k.out.dtype
    axis = 1 if k.outer else 2
    if partials is None:
        def partials(state):
            return reduced(ufunc, get(state), axis, acc)
    if k.init is None:
        def run(state):
            state[tid] = partials(state)
        return run
    # A single stage: the one partial of each output is its result, then the init.
    init, shape = read(k.init), k.out.shape

    def single_stage(state):
        value = ufunc(init(state).astype(acc, copy=False), partials(state).reshape(shape))
        state[tid] = np.asarray(value).astype(acc, copy=False).reshape(shape)
    return single_stage


@reference(codelets.ReduceCombine)
def reduce_combine(k: codelets.ReduceCombine, read, convert: Callable | None = None,
                   partials: Callable | None = None):
    """out = init op (the partials reduced over `axis` in order), in
    out.dtype. convert(array, dtype) and partials(state) -> the partials
    reduced: faster ways to the same values, when given (model/fast/)."""
    get, tid, ufunc, axis = read(k.partials), k.out.id, REDUCE_OPS[k.op], k.axis
    init = None if k.init is None else read(k.init)
    dtype, shape, acc = k.out.dtype, k.out.shape, k.partials.dtype
    if partials is None:
        def partials(state):
            return reduced(ufunc, get(state), axis, acc)
    if convert is None:
        def convert(value, dtype):
            return value.astype(dtype)

    def run(state):
        value = partials(state)
        if init is not None:
            value = ufunc(init(state).astype(acc, copy=False), value)
        value = np.asarray(value)
        if value.dtype != dtype:
            value = convert(value, dtype)
        state[tid] = value.reshape(shape)   # value is new
    return run


@reference(codelets.TreeReduce)
def tree_reduce(k: codelets.TreeReduce, read):
    readers = [read(v) for v in k.inputs]
    dtypes = [v.dtype for v in k.inputs] * 2 + [i.dtype for i in k.body]
    steps = [(instruction(ins, dtypes)[0], ins.args) for ins in k.body]
    results = k.results
    inits = None if k.init is None else [read(i) for i in k.init]
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
                        for c, x in zip(combined, xs, strict=True)]
            xs = [np.concatenate([c, x[2 * half:]]) if count % 2 else c for c, x in zip(combined, xs, strict=True)]
        values = [x[0] for x in xs]
        if inits is not None:
            values = body([init(state) for init in inits] + values)
        for (tid, dtype, shape), value in zip(outs, values, strict=True):
            state[tid] = np.array(np.broadcast_to(value, shape), dtype=dtype)
    return run


@reference(codelets.WindowSelect)
def window_select(k: codelets.WindowSelect, read):
    """The scan runs over window positions, each step over all outputs at
    once, so a window's select calls are made in XLA's order. The selected
    value and position are updated by bit masks: np.where branches on
    each element and mispredicts on random data (5x slower)."""
    values, tid, slot_dtype = read(k.values), k.out.id, k.out.dtype
    padding = read(k.padding) if k.padding is not None else None
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
