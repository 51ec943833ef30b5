"""Executors of the linear-algebra kernels (graph.codelets_linalg): LAPACK
through numpy/scipy per matrix, in the operands' dtype (sgetrf, sgeqrf,
sorgqr, ssyevd, sgesdd, spotrf, ssytrd, strsm, sgeev, and their complex64
siblings cgetrf, cungqr, cheevd, chetrd, cgeev...), as XLA:CPU calls it.
Empty matrices give empty (or identity-like) results, as LAPACK's callers
do."""
from __future__ import annotations

import numpy as np
from scipy.linalg import blas, lapack

from jax_ipu.graph import codelets_linalg
from jax_ipu.model.registry import reference


def _batched(fn, *arrays):
    """fn over the matrices of the leading dims; fn returns a tuple."""
    batch = arrays[0].shape[:-2]
    count = int(np.prod(batch, dtype=np.int64))
    flat = [a.reshape((count,) + a.shape[len(batch):]) for a in arrays]
    return [fn(*parts) for parts in zip(*flat, strict=True)], batch


def _cholesky(a, *, lower=True):
    if not a.size:
        return (a.copy(),)
    with np.errstate(all="ignore"):
        c, info = lapack.get_lapack_funcs("potrf", (a,))(a, lower=lower, clean=True)
    return (c if info == 0 else np.full_like(a, np.nan),)


def _triangular_solve(a, b, *, left_side, lower, unit_diagonal, transpose_a):
    """BLAS trsm, as XLA:CPU: no singularity check, so a zero on the
    diagonal gives inf/nan rather than an error."""
    if not b.size:
        return (b.copy(),)
    trans = {"NO_TRANSPOSE": 0, "TRANSPOSE": 1, "ADJOINT": 2}[transpose_a]
    trsm = blas.get_blas_funcs("trsm", (a, b))
    with np.errstate(all="ignore"):
        x = trsm(1.0, a, b, side=0 if left_side else 1, lower=lower, trans_a=trans, diag=int(unit_diagonal))
    return (x,)


def _lu(a):
    m = a.shape[0]
    if not a.size:
        return a.copy(), np.zeros(0, np.int32), np.arange(m, dtype=np.int32)
    lu, piv, _ = lapack.get_lapack_funcs("getrf", (a,))(a)
    perm = np.arange(m, dtype=np.int32)
    for i, p in enumerate(piv[:min(a.shape)]):
        perm[[i, p]] = perm[[p, i]]
    return lu, piv[:min(a.shape)].astype(np.int32), perm


def _qr(a):
    if not a.size:
        return a.copy(), np.zeros(min(a.shape), a.dtype)
    qr, tau, _, _ = lapack.get_lapack_funcs("geqrf", (a,))(a)
    return qr, tau


def _householder(a, taus):
    m, n = a.shape
    if n == 0 or m == 0:
        return (a.copy(),)
    name = "ungqr" if a.dtype.kind == "c" else "orgqr"
    q, _, _ = lapack.get_lapack_funcs(name, (a,))(a, taus, lwork=max(1, n * 64))
    return (q,)


def _tridiagonal(a, *, lower=True):
    name = "hetrd" if a.dtype.kind == "c" else "sytrd"
    c, d, e, tau, _ = lapack.get_lapack_funcs(name, (a,))(a, lower=lower)
    return c, d, e, tau


def _nan(*shapes, dtype):
    return tuple(np.full(shape, np.nan, dtype) for shape in shapes)


def _eigh(a, *, lower=True):
    # A matrix with NaN or inf (or one LAPACK cannot converge on) gives NaN
    # results, as JAX's CPU backend does, not an error.
    n = a.shape[-1]
    if np.isfinite(a).all():
        try:
            w, v = np.linalg.eigh(a, UPLO="L" if lower else "U")
            return v, w
        except np.linalg.LinAlgError:
            pass
    return _nan((n, n), (n,), dtype=a.dtype)


def _svd(a, *, full_matrices, compute_uv):
    m, n = a.shape[-2:]
    k = min(m, n)
    if np.isfinite(a).all():
        try:
            if not compute_uv:
                return (np.linalg.svd(a, compute_uv=False),)
            u, s, vt = np.linalg.svd(a, full_matrices=full_matrices)
            return s, u, vt
        except np.linalg.LinAlgError:
            pass
    if not compute_uv:
        return _nan((k,), dtype=a.dtype)
    return _nan((k,), (m, m if full_matrices else k), (n if full_matrices else k, n), dtype=a.dtype)


def _eig(a, *, compute_left=False, compute_right=False):
    """LAPACK geev, as XLA:CPU calls it: eigenvalues (and left and right
    eigenvectors, each of unit norm with its largest component real) as
    complex numbers; a real matrix's conjugate pairs unpacked from the
    columns (re, im) geev stores them in. NaN where LAPACK fails or the
    matrix holds NaN or infinity."""
    n = a.shape[-1]
    complex_dtype = np.result_type(a.dtype, np.complex64)
    shapes = [(n,)] + [(n, n)] * (int(compute_left) + int(compute_right))
    if not np.isfinite(a).all():
        return _nan(*shapes, dtype=complex_dtype)
    geev = lapack.get_lapack_funcs("geev", (a,))
    with np.errstate(all="ignore"):
        if a.dtype.kind == "c":
            w, vl, vr, info = geev(a, compute_vl=int(compute_left), compute_vr=int(compute_right))
        else:
            wr, wi, vl, vr, info = geev(a, compute_vl=int(compute_left), compute_vr=int(compute_right))
            w = wr + 1j * wi.astype(complex_dtype)
            vl, vr = _unpacked(wi, vl), _unpacked(wi, vr)
    if info != 0:
        return _nan(*shapes, dtype=complex_dtype)
    return (w,) + ((vl,) if compute_left else ()) + ((vr,) if compute_right else ())


def _unpacked(wi: np.ndarray, v: np.ndarray) -> np.ndarray:
    """geev's real eigenvectors as complex ones: a conjugate pair (wi > 0,
    then < 0) shares columns j (real part) and j + 1 (imaginary part)."""
    out = v.astype(np.result_type(v.dtype, np.complex64))
    j = 0
    while j < len(wi):
        if wi[j] != 0 and j + 1 < len(wi):
            out[:, j] = v[:, j] + 1j * v[:, j + 1]
            out[:, j + 1] = v[:, j] - 1j * v[:, j + 1]
            j += 2
        else:
            j += 1
    return out


_FUNCTIONS = {"cholesky": _cholesky, "triangular_solve": _triangular_solve, "lu": _lu, "qr": _qr,
              "householder": _householder, "eigh": _eigh, "svd": _svd, "tridiagonal": _tridiagonal, "eig": _eig}


@reference(codelets_linalg.Factorize)
def _build_factorize(k: codelets_linalg.Factorize, read):
    readers = [read(v) for v in k.inputs]
    fn, attrs = _FUNCTIONS[k.op], dict(k.attrs)
    outs = [(t.id, t.dtype, t.shape) for t in k.outs]

    def run(state):
        results, batch = _batched(lambda *m: fn(*m, **attrs), *[get(state) for get in readers])
        for i, (tid, dtype, shape) in enumerate(outs):
            parts = [r[i] for r in results]
            value = np.stack(parts) if parts else np.zeros(shape, dtype)
            state[tid] = np.asarray(value).astype(dtype, copy=False).reshape(shape)
    return run


BUILDERS = {codelets_linalg.Factorize: _build_factorize}
