"""Fast executors of reductions: partials over short contiguous axes made
element after element (numpy's reduce over a short axis costs many times
as much: a max pool's 2x2 windows), and combines whose float16 result is
converted by XLA:CPU (xla_chains.convert). The values are the reference
executors' (model/executors/reduce.py), but for the order of a float sum
over more than eight elements, which is numpy's own in the reference
(its pairwise sums) and one after the other here, as XLA:CPU combines a
window's."""
from __future__ import annotations

from jax_ipu.graph import codelets
from jax_ipu.model.executors import reduce as reference
from jax_ipu.model.fast import xla_chains
from jax_ipu.model.registry import fast
from jax_ipu.ops import REDUCE_OPS

# Reductions over at most this many contiguous elements, of at least
# SHORT_AXIS_ROWS outputs, go element by element along the axis.
SHORT_AXIS = 16
SHORT_AXIS_ROWS = 256


@fast(codelets.ReducePartials)
def reduce_partials(k: codelets.ReducePartials, read, whole: bool = False):
    ufunc, acc = REDUCE_OPS[k.op], k.out.dtype
    rows, size = k.input.shape[0] * k.input.shape[1], k.input.shape[2]
    if k.outer or reference.rounds_each_step(ufunc, acc) or not (1 < size <= SHORT_AXIS and rows >= SHORT_AXIS_ROWS):
        return None
    get = read(k.input)

    def short(state):
        # Element after element into the accumulator, in order.
        x = get(state)
        total = x[..., 0].astype(acc)      # a copy of its own
        for i in range(1, size):
            ufunc(total, x[..., i], out=total)
        return total
    return reference.reduce_partials(k, read, partials=short)


@fast(codelets.ReduceCombine)
def reduce_combine(k: codelets.ReduceCombine, read, whole: bool = False):
    """A float16 product's sum is converted from float32 by XLA:CPU."""
    if k.out.dtype == k.partials.dtype:
        return None
    return reference.reduce_combine(k, read, convert=xla_chains.convert)
