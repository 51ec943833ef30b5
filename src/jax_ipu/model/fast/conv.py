"""The fast executor of convolutions' partial sums (model/executors/conv.py
says what they are): each chunk as one product of host-side patches (the
input's windows, read as one strided array where fast.strided plans it)
and the chunk's kernel block, a BLAS call per chunk on one thread, as
planned matmuls run (fast/matmul.py); and its fusion with the
convolution's reduction, the chunks summed as they are made. BLAS sums a
chunk's products in its own order, where the reference adds each kernel
position's to the partials in turn: the values agree within float
tolerance (tests/ipu/model/test_fast_matches_reference.py). Float16
partials, rounded after each kernel position, and integers stay with the
reference."""
from __future__ import annotations

import math

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.graph.codelets_conv import ConvPartials
from jax_ipu.graph.views import View
from jax_ipu.model.executors import conv as reference_conv
from jax_ipu.model.executors.reduce import reduced
from jax_ipu.model.fast import blas
from jax_ipu.model.fast.matmul import Combined, build_sum_of_combined, converted, takes_combined
from jax_ipu.model.registry import Fusion, fast, fusion


def matmul_views(k: ConvPartials) -> tuple[View, View]:
    """The convolution's chunks as a planned matmul's: the patches
    [G, M, K] (M the output positions, in the partials' order) and the
    kernel [G, K, Co], K ordered (input-channel block, kernel blocks,
    positions within the kernel blocks, channels within the block), so
    that chunk j is the j-th K-chunk."""
    x, w = k.input, k.weights
    groups, batch, channels = x.shape[:3]
    spatial = len(k.window)
    patches = x.then("windows", k.window, np.zeros((), x.dtype))        # [G, N, Ci, *outs, *window]
    outs = patches.shape[3:3 + spatial]
    kernel_splits = [(c, size // c) for (size, *_), c in zip(k.window, k.window_chunks, strict=True)]
    split = patches.then("reshape", (groups, batch, k.in_chunks, channels // k.in_chunks, *outs,
                                     *(n for pair in kernel_splits for n in pair)))
    field = tuple(range(4, 4 + spatial))
    rows = (*field, 1) if k.batch_inner else (1, *field)
    blocks = tuple(4 + spatial + 2 * d for d in range(spatial))
    depth = (2, *blocks, *(b + 1 for b in blocks), 3)
    m, kk = batch * math.prod(outs), channels * math.prod(size for size, *_ in k.window)
    lhs = split.then("transpose", (0, *rows, *depth)).then("reshape", (groups, m, kk))
    co = w.shape[-1]
    w_split = w.then("reshape", (groups, *(n for pair in kernel_splits for n in pair), k.in_chunks,
                                 channels // k.in_chunks, co))
    w_blocks = tuple(1 + 2 * d for d in range(spatial))
    rhs = w_split.then("transpose", (0, 1 + 2 * spatial, *w_blocks, *(b + 1 for b in w_blocks), 2 + 2 * spatial,
                                     3 + 2 * spatial)).then("reshape", (groups, kk, co))
    return lhs, rhs


def _prepared(k: ConvPartials, read):
    """(fn(state) -> (patches, kernel) in float32, chunks, chunk size, the
    product's [G, M, Co]), or None for partials this executor leaves to
    the reference."""
    if k.out.dtype != np.float32:
        return None
    lhs, rhs = matmul_views(k)
    a, b = converted(lhs, k.out.dtype, read), converted(rhs, k.out.dtype, read)
    chunks = k.out.shape[0]

    def operands(state):
        return a(state), b(state)
    return operands, chunks, lhs.shape[2] // chunks, (lhs.shape[0], lhs.shape[1], rhs.shape[2])


def _shares(shape, depth: int, whole: bool) -> bool:
    groups, m, n = shape
    return len(blas.row_blocks(groups, m, depth, n, whole)) > 1


@fast(ConvPartials)
def build(k: ConvPartials, read, whole: bool = False):
    prepared = _prepared(k, read)
    if prepared is None:
        return None
    operands, chunks, size, shape = prepared
    tid = k.out.id

    def run(state):
        a, b = operands(state)
        out = np.empty((chunks, *shape), np.float32)
        blas.matmul_partials(a, b, out, chunks, size, whole)
        state[tid] = out.reshape(k.out.shape)
    run.shares = _shares(shape, chunks * size, whole)
    return run


def build_combined(k: ConvPartials, read, whole: bool = False):
    """The partials are scratch, read only by the convolution's reduction:
    they are summed here, row block by row block, in the same fixed order."""
    prepared = _prepared(k, read)
    if prepared is None:
        # (A fusion's producer always runs here: the reference, then summed.)
        reference = reference_conv.conv_partials(k, read)
        tid = k.out.id

        def summed(state):
            reference(state)
            state[tid] = Combined(reduced(np.add, state[tid], 0, k.out.dtype).reshape(-1))
        return summed
    operands, chunks, size, shape = prepared
    scratch = blas.CombineScratch()
    tid = k.out.id

    def run(state):
        a, b = operands(state)
        state[tid] = Combined(blas.matmul_combined(a, b, chunks, size, k.out.dtype, scratch, whole).reshape(-1))
    run.shares = _shares(shape, chunks * size, whole)
    return run


fusion(Fusion(ConvPartials, "out", codelets.ReduceCombine, "partials", takes_combined, build_combined,
              build_sum_of_combined))
