"""What the vertices of one compute set compute together. Each kernel is
the vectorised equivalent of running every vertex of its compute set, and
one record (graph/records.py): its fields say what the vertices read and
write. The Model has a reference executor per kernel class
(model/executors/), and may have a fast one beside it (model/fast/)."""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_ipu.graph.records import attribute, codelet, reads, writes
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.ops import REDUCE_OPS


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One element-wise op of a fused chain: `op` is the StableHLO op name,
    `args` index the chain's registers (inputs first, then results)."""
    op: str
    args: tuple[int, ...]
    dtype: np.dtype
    attrs: tuple = ()              # sorted (name, value) pairs


@codelet
class ElementwiseChain:
    """A fused chain of element-wise ops. Inputs are views (read on each
    tile) or numpy scalars (immediates held in vertex state); every output
    has the chain's shape."""
    inputs: tuple[View | np.ndarray, ...] = reads("*operand", through_views=True)
    instructions: tuple[Instruction, ...] = attribute("*instruction")
    outputs: tuple[tuple[int, Tensor], ...] = writes("*registered")   # (register, tensor written)
    shape: tuple[int, ...] = attribute("*int")


@codelet
class Fill:
    """out = value everywhere."""
    out: Tensor = writes()
    value: np.ndarray = attribute("array")


@codelet
class MatMulPartials:
    """out[k, b, m, n] = sum over the k-th K-chunk of lhs[b, m, :] rhs[b, :, n],
    accumulated in out.dtype (fp32 partials for fp16 inputs)."""
    lhs: View = reads(through_views=True)                   # [B, M, K]
    rhs: View = reads(through_views=True)                   # [B, K, N]
    # [k_chunks, B, M, N]; when only the matmul's own reduction reads it, a
    # fast executor may leave the partials already summed (model/fast/fusion.py).
    out: Tensor = writes(stand_in="the partials summed over the chunks in order, for the sum's reader")


@codelet
class ReducePartials:
    """out[o, j] = op-reduction of input[o, j, :], accumulated in out.dtype;
    `outer`: out[j, o] = that of input[j, :, o] (reduced dims leading, as a
    batch sum's), the chunk's rows combined one after the other. With
    `init` (one chunk: a single-stage reduction), out[o] = init op that
    reduction: the reduction's result, with no combine stage."""
    input: View = reads()          # [O, chunks, chunk_size], or [chunks, chunk_size, O] if outer
    op: str = attribute("str", choices=REDUCE_OPS)
    out: Tensor = writes()         # [O, chunks] ([chunks, O] if outer), or [O] with init
    outer: bool = attribute("bool", default=False)
    init: View | np.ndarray | None = reads("?operand", default=None)   # a scalar tensor or an immediate


@codelet
class ReduceCombine:
    """out = init op (partials reduced over `axis` in a fixed order),
    converted to out.dtype."""
    partials: View = reads()
    axis: int = attribute("int")
    op: str = attribute("str", choices=REDUCE_OPS)
    init: View | np.ndarray | None = reads("?operand")   # a scalar tensor, an immediate, or None
    out: Tensor = writes()


@codelet
class TreeReduce:
    """Reduces `inputs` (one per operand of a variadic reduce, e.g. values
    and indices for argmax) along `axis` by applying `body` pairwise in a
    tree, then, when `init` is given, body(init..., result...). Body
    registers: the accumulators, the new values, then instruction results;
    an instruction "constant" holds its value in attrs."""
    inputs: tuple[View, ...] = reads("*view")
    axis: int = attribute("int")
    body: tuple[Instruction, ...] = attribute("*instruction")
    results: tuple[int, ...] = attribute("*int")
    init: tuple[View | np.ndarray, ...] | None = reads("?*operand")
    outs: tuple[Tensor, ...] = writes("*tensor")


@codelet
class WindowSelect:
    """select_and_scatter's select, scanning each window as XLA does: per
    output (a column of `values`, [window, outputs], rows in window
    order), the window position picked. The first element that is not
    padding is selected; each later one replaces it unless
    select(selected, element) holds (so with GE the first of equal maxima
    stays, and a selected NaN gives way to the next element). `select` is
    a body program over registers (selected, element) whose bool result
    is register `result`. `padding` ([window, outputs] bool, or None when
    there is none) marks positions that are never picked while the window
    has an element; a window of padding alone picks a padding position."""
    values: View = reads()
    padding: View | None = reads("?view")
    select: tuple[Instruction, ...] = attribute("*instruction")
    result: int = attribute("int")
    out: Tensor = writes()         # [outputs], uint8 (int32 for windows of 255 or more)
