"""Kernels of data-dependent indexing and sorting compute sets: what all
the vertices of one compute set compute together (see graph.codelets).
Indices are read at run time, so each vertex reads the whole operand it
indexes into (the exchange the cost pass charges is that upper bound)."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph.codelets import Instruction
from jax_ipu.graph.records import attribute, codelet, reads, writes
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View
from jax_ipu.ops import REDUCE_OPS


@codelet
class DynamicSlice:
    """out = operand[starts : starts + out.shape], each start (a scalar
    view or immediate) clamped so that the slice stays in bounds."""
    operand: View = reads()
    starts: tuple[View | np.ndarray, ...] = reads("*operand")
    out: Tensor = writes()


@codelet
class DynamicUpdateSlice:
    """out = operand with update written at the clamped starts."""
    operand: View = reads()
    update: View = reads()
    starts: tuple[View | np.ndarray, ...] = reads("*operand")
    out: Tensor = writes()


@codelet
class Gather:
    """XLA's gather (StableHLO semantics, starts clamped into bounds)."""
    operand: View = reads()
    indices: View = reads()
    dimension_numbers: object = attribute("dimensions")   # stablehlo GatherDimensionNumbers
    slice_sizes: tuple[int, ...] = attribute("*int")
    out: Tensor = writes()


@codelet
class Scatter:
    """XLA's scatter: windows whose start is out of bounds are skipped;
    updates are combined in order by `combiner` ("replace", a reduce ufunc
    name, or None to run `body` element by element)."""
    operands: tuple[View, ...] = reads("*view")
    indices: View = reads()
    updates: tuple[View, ...] = reads("*view")
    dimension_numbers: object = attribute("dimensions")   # stablehlo ScatterDimensionNumbers
    combiner: str | None = attribute("?str", choices=("replace", *REDUCE_OPS))
    body: tuple[Instruction, ...] = attribute("*instruction")
    results: tuple[int, ...] = attribute("*int")
    outs: tuple[Tensor, ...] = writes("*tensor")


@codelet
class Sort:
    """Sorts rows ([rows, n] views) of every operand by the permutation
    that stably sorts them under the comparator `body` (registers: lhs and
    rhs of each operand in turn, then instruction results). When `key` is
    set, (register, descending) of a key computed from one operand alone,
    the rows sort by that key directly."""
    inputs: tuple[View, ...] = reads("*view")
    body: tuple[Instruction, ...] = attribute("*instruction")
    result: int = attribute("int")
    key: tuple[int, bool] | None = attribute("any")
    outs: tuple[Tensor, ...] = writes("*tensor")


@codelet
class BlockSort:
    """The first step of sorting rows too long for one tile by a key
    (Sort.key): each row ([rows, n] views) is cut into `blocks` blocks of
    `block` elements on their own tiles (the last padded past n), and each
    block is sorted by (key, position in the row), padding last. outs:
    [rows, blocks * block] per operand, and `index`, the elements'
    positions in the row (int32)."""
    inputs: tuple[View, ...] = reads("*view")
    body: tuple[Instruction, ...] = attribute("*instruction")
    key: tuple[int, bool] = attribute("any")
    blocks: int = attribute("int")
    block: int = attribute("int")
    outs: tuple[Tensor, ...] = writes("*tensor")
    index: Tensor = writes()


@codelet
class MergeSplit:
    """One stage of the sorting network over BlockSort's blocks, from
    `sources` into `targets` (the operands' blocks, then the index: a
    vertex may not write what another reads in the same compute set, so
    the stages alternate between two sets of tensors): for each pair
    (lo[i], hi[i]) of blocks of every row, the two sorted blocks are merged
    by (key, position) and the smaller half goes to block lo[i], the rest
    to hi[i]; unpaired blocks are copied. `n`: the row's length before
    padding (positions >= n are padding and sort last)."""
    sources: tuple[Tensor, ...] = reads("*tensor")
    targets: tuple[Tensor, ...] = writes("*tensor")
    body: tuple[Instruction, ...] = attribute("*instruction")
    key: tuple[int, bool] = attribute("any")
    n: int = attribute("int")
    block: int = attribute("int")
    lo: tuple[int, ...] = attribute("*int")
    hi: tuple[int, ...] = attribute("*int")


@codelet
class TopK:
    """The k largest of each row of `input` ([rows, n]) in IEEE total
    order, lower indices first among equals, and their int32 indices."""
    input: View = reads()
    values: Tensor = writes()   # [rows, k]
    indices: Tensor = writes()   # [rows, k]
