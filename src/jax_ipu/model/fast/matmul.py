"""The fast executor of matmul partial products (model/executors/matmul.py
says what they are): each K-chunk's product a BLAS call on one thread, in
row blocks the helper thread may share (blas.py), the operands read as one
strided array of their tensor (strided.py); and its fusion with the
matmul's reduction: when only that reads the partials, they are summed
here, row block by row block while in cache, and the reduction takes the
sum (Combined, the stand-in MatMulPartials' record allows)."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.graph.views import View, apply_ops
from jax_ipu.model.executors import reduce as reference_reduce
from jax_ipu.model.fast import blas, strided, xla_chains
from jax_ipu.model.registry import Fusion, fast, fusion


def _operands(k: codelets.MatMulPartials, read):
    """fn(state) -> (lhs, rhs) in the partials' dtype."""
    lhs, rhs = converted(k.lhs, k.out.dtype, read), converted(k.rhs, k.out.dtype, read)

    def get(state):
        return lhs(state), rhs(state)
    return get


def converted(view, acc: np.dtype, read):
    """fn(state) -> the view's array in `acc` (float16 operands of float32
    partials: the products are exact in float32): one strided view or
    copy of its tensor where fast.strided plans the view, else _unplanned.
    The same values either way."""
    unplanned = _unplanned(view, acc, read)
    planned = strided.operand_reader(view, acc) if isinstance(view, View) and view.ops else None
    if planned is None:
        return unplanned

    def get(state):
        value = planned(state)
        return unplanned(state) if value is None else value
    return get


def _unplanned(view, acc: np.dtype, read):
    """The view's ops one by one. A view reading elements more than once
    (im2col windows, broadcasts) converts its tensor first and reads that
    through the view: numpy's conversions are slow per element, and the
    patches of a 3x3 convolution are 9 times its input. Large aligned
    arrays are converted by XLA:CPU
    (xla_chains.convert)."""
    get = read(view)
    if view.dtype == acc:
        return get
    if isinstance(view, View) and view.ops and view.size > view.tensor.size:
        tid, shape, ops = view.tensor.id, view.tensor.shape, view.ops
        return lambda state: apply_ops(xla_chains.convert(state[tid].reshape(shape), acc), ops)
    return lambda state: xla_chains.convert(get(state), acc)


def _half_partials(dtype: np.dtype) -> bool:
    """float16 partials: each chunk rounded once and the chunks summed in
    float16, which the reference does (exactly, as its own bits)."""
    return dtype == np.float16


@fast(codelets.MatMulPartials)
def build(k: codelets.MatMulPartials, read, whole: bool = False):
    if _half_partials(k.out.dtype):
        return None
    operands, tid = _operands(k, read), k.out.id
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


def build_combined(k: codelets.MatMulPartials, read, whole: bool = False):
    """The partials are scratch, read only by the matmul's reduction
    (ReduceCombine over the chunks, "add"): they are summed here, row
    block by row block while in cache, in the same fixed order, and the
    reduction takes the sum."""
    operands, tid, acc = _operands(k, read), k.out.id, k.out.dtype
    chunks = k.out.shape[0]
    size = k.lhs.shape[2] // chunks if chunks else 0
    scratch = blas.CombineScratch()

    def run(state):
        a, b = operands(state)
        state[tid] = Combined(blas.matmul_combined(a, b, chunks, size, acc, scratch, whole).reshape(-1))
    run.shares = _shares(k, whole)
    return run


def takes_combined(k: codelets.ReduceCombine) -> bool:
    """Whether this reduction sums a matmul's partials over the chunks as
    build_combined leaves them (the only reader that can)."""
    whole = k.partials.tensor.shape
    return (k.op == "add" and not _half_partials(k.partials.dtype) and k.axis == 0 and k.partials.is_whole_tensor
            and k.partials.shape == (whole[0], int(np.prod(whole[1:], dtype=np.int64))))


def build_sum_of_combined(k: codelets.ReduceCombine, read):
    """The matmul's reduction, its partials found combined."""
    pid = k.partials.tensor.id
    return reference_reduce.reduce_combine(k, read, convert=xla_chains.convert,
                                           partials=lambda state: state[pid].value)


fusion(Fusion(codelets.MatMulPartials, "out", codelets.ReduceCombine, "partials", takes_combined,
              build_combined, build_sum_of_combined))
