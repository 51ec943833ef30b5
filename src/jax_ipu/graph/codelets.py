"""What the vertices of one compute set compute together. Each kernel is
the vectorised equivalent of running every vertex of its compute set; the
engine has one executor per kernel class (model.kernels)."""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One element-wise op of a fused chain: `op` is the StableHLO op name,
    `args` index the chain's registers (inputs first, then results)."""
    op: str
    args: tuple[int, ...]
    dtype: np.dtype
    attrs: tuple = ()              # sorted (name, value) pairs


@dataclasses.dataclass(eq=False)
class ElementwiseChain:
    """A fused chain of element-wise ops. Inputs are views (read on each
    tile) or numpy scalars (immediates held in vertex state); every output
    has the chain's shape."""
    inputs: tuple[View | np.ndarray, ...]
    instructions: tuple[Instruction, ...]
    outputs: tuple[tuple[int, Tensor], ...]   # (register, tensor written)
    shape: tuple[int, ...]


@dataclasses.dataclass(eq=False)
class Fill:
    out: Tensor
    value: np.ndarray


@dataclasses.dataclass(eq=False)
class MatMulPartials:
    """out[k, b, m, n] = sum over the k-th K-chunk of lhs[b, m, :] rhs[b, :, n],
    accumulated in out.dtype (fp32 partials for fp16 inputs)."""
    lhs: View                      # [B, M, K]
    rhs: View                      # [B, K, N]
    out: Tensor                    # [k_chunks, B, M, N]


@dataclasses.dataclass(eq=False)
class ReducePartials:
    """out[o, j] = op-reduction of input[o, j, :], accumulated in out.dtype;
    `outer`: out[j, o] = that of input[j, :, o] (reduced dims leading, as a
    batch sum's), the chunk's rows combined one after the other. With
    `init` (one chunk: a single-stage reduction), out[o] = init op that
    reduction: the reduction's result, with no combine stage."""
    input: View                    # [O, chunks, chunk_size], or [chunks, chunk_size, O] if outer
    op: str                        # "add" | "multiply" | "maximum" | "minimum" | "and" | "or"
    out: Tensor                    # [O, chunks] ([chunks, O] if outer), or [O] with init
    outer: bool = False
    init: View | np.ndarray | None = None   # a scalar tensor or an immediate


@dataclasses.dataclass(eq=False)
class ReduceCombine:
    """out = init op (partials reduced over `axis` in a fixed order),
    converted to out.dtype."""
    partials: View
    axis: int
    op: str
    init: View | np.ndarray | None   # a scalar tensor, an immediate, or None
    out: Tensor


@dataclasses.dataclass(eq=False)
class TreeReduce:
    """Reduces `inputs` (one per operand of a variadic reduce, e.g. values
    and indices for argmax) along `axis` by applying `body` pairwise in a
    tree, then, when `init` is given, body(init..., result...). Body
    registers: the accumulators, the new values, then instruction results;
    an instruction "constant" holds its value in attrs."""
    inputs: tuple[View, ...]
    axis: int
    body: tuple[Instruction, ...]
    results: tuple[int, ...]
    init: tuple[View | np.ndarray, ...] | None
    outs: tuple[Tensor, ...]



@dataclasses.dataclass(eq=False)
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
    values: View
    padding: View | None
    select: tuple[Instruction, ...]
    result: int
    out: Tensor                    # [outputs], uint8 (int32 for windows of 255 or more)
