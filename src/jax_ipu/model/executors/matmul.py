"""Executors of matmul partial products (K-chunk partials, or their sum
in the plan's order when only the reduction reads them)."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.model.executors.common import reader, register
from jax_ipu.model.fast import blas

def _operands(k: codelets.MatMulPartials):
    """fn(state) -> (lhs, rhs) in the partials' dtype."""
    lhs, rhs, acc = reader(k.lhs), reader(k.rhs), k.out.dtype

    def get(state):
        a, b = lhs(state), rhs(state)
        return (a if a.dtype == acc else a.astype(acc)), (b if b.dtype == acc else b.astype(acc))
    return get


@register(codelets.MatMulPartials)
def build(k: codelets.MatMulPartials, whole: bool = False):
    operands, tid = _operands(k), k.out.id
    chunks, batch, m, n = k.out.shape
    size = k.lhs.shape[2] // chunks if chunks else 0

    def run(state):
        a, b = operands(state)
        out = np.empty((chunks, batch, m, n), dtype=k.out.dtype)
        blas.matmul_partials(a, b, out, chunks, size, whole)
        state[tid] = out
    run.shares = _shares(k, whole)
    return run


def _shares(k: codelets.MatMulPartials, whole: bool) -> bool:
    """Whether the product is cut in row halves for the helper thread."""
    batch, m, kk = k.lhs.shape
    return len(blas.row_blocks(batch, m, kk, k.rhs.shape[-1], whole)) > 1


class Combined:
    """What a combined matmul leaves in its partials tensor: the partials
    already summed over the chunks in the plan's order, [batch * m * n]."""
    __slots__ = ("value",)

    def __init__(self, value: np.ndarray):
        self.value = value


def build_combined(k: codelets.MatMulPartials, whole: bool = False):
    """The partials are scratch, read only by the matmul's reduction
    (ReduceCombine over the chunks, "add"): they are summed here, row
    block by row block while in cache, in the same fixed order, and the
    reduction takes the sum."""
    operands, tid, acc = _operands(k), k.out.id, k.out.dtype
    chunks = k.out.shape[0]
    size = k.lhs.shape[2] // chunks if chunks else 0
    scratch = blas.CombineScratch()

    def run(state):
        a, b = operands(state)
        state[tid] = Combined(blas.matmul_combined(a, b, chunks, size, acc, scratch, whole).reshape(-1))
    run.shares = _shares(k, whole)
    return run
