"""The reference executor of matmul partial products: each K-chunk's
product on its own, in the partials' dtype (model/fast/matmul.py runs
them on BLAS in row blocks, or leaves them summed for the matmul's
reduction)."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.model.registry import reference


@reference(codelets.MatMulPartials)
def matmul_partials(k: codelets.MatMulPartials, read):
    """out[j] = lhs[..., j-th K-chunk] @ rhs[..., j-th K-chunk, :], the
    operands converted to out.dtype first (float16 operands of float32
    partials: their products are exact in float32)."""
    lhs, rhs, tid, acc = read(k.lhs), read(k.rhs), k.out.id, k.out.dtype
    chunks = k.out.shape[0]
    size = k.lhs.shape[2] // chunks if chunks else 0

    def run(state):
        a, b = np.asarray(lhs(state), dtype=acc), np.asarray(rhs(state), dtype=acc)
        out = np.empty(k.out.shape, acc)
        for j in range(chunks):
            np.matmul(a[..., j * size:(j + 1) * size], b[..., j * size:(j + 1) * size, :], out=out[j])
        state[tid] = out
    return run
