"""The reference executor of matmul partial products: each K-chunk's
product on its own, summed as a convolution's kernel position is
(executors/conv.py: float32 for float partials) and stored in the
partials' dtype (model/fast/matmul.py runs them on BLAS in row blocks,
or leaves them summed for the matmul's reduction)."""
from __future__ import annotations

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.model.executors.conv import products_dtype
from jax_ipu.model.registry import reference


@reference(codelets.MatMulPartials)
def matmul_partials(k: codelets.MatMulPartials, read):
    """out[j] = lhs[..., j-th K-chunk] @ rhs[..., j-th K-chunk, :], the
    operands converted to the products' type first (float32 for float
    partials: float16 operands' products are exact in it), the chunk's sum
    then rounded once to float16 partials (a matmul is a convolution of
    one kernel position, its K-chunk the input channels)."""
    lhs, rhs, tid, acc = read(k.lhs), read(k.rhs), k.out.id, k.out.dtype
    dot = products_dtype(acc)
    chunks = k.out.shape[0]
    size = k.lhs.shape[2] // chunks if chunks else 0

    def run(state):
        a, b = np.asarray(lhs(state), dtype=dot), np.asarray(rhs(state), dtype=dot)
        out = np.empty(k.out.shape, dot)
        for j in range(chunks):
            np.matmul(a[..., j * size:(j + 1) * size], b[..., j * size:(j + 1) * size, :], out=out[j])
        state[tid] = out if dot == acc else out.astype(acc)
    return run
