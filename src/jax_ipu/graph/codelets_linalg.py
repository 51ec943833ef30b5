"""Kernels of the dense linear-algebra ops (cholesky, triangular_solve,
LU, QR, Householder products, eigh, svd): each vertex factors whole
matrices on its tile (Poplar has no planned multi-tile factorisation; one
matrix a tile is how poplin-free IPU code runs small factorisations)."""
from __future__ import annotations

from jax_ipu.graph.records import attribute, codelet, reads, writes
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View

# The factorisations Factorize computes.
FACTORIZATIONS = ("cholesky", "triangular_solve", "lu", "qr", "householder", "tridiagonal", "eigh", "svd")


@codelet
class Factorize:
    """outs = `op`(inputs) per matrix of the leading batch dimensions, in
    the inputs' dtype as LAPACK computes it; `attrs` are sorted (name,
    value) pairs of the op's options."""
    op: str = attribute("str", choices=FACTORIZATIONS)
    inputs: tuple[View, ...] = reads("*view")
    outs: tuple[Tensor, ...] = writes("*tensor")
    attrs: tuple = attribute("any", default=())
