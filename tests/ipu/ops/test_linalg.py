"""Dense linear algebra on the ipu device against JAX's CPU backend (f32):
stablehlo.cholesky and triangular_solve from JAX's generic rules, QR's
custom_calls (Qr, ProductOfElementaryHouseholderReflectors), and LU, eigh
and svd through the ipu lowerings of jax_ipu.frontend.jax_rules. Both sides call
LAPACK's algorithms in f32; tolerance 1e-4 relative to the result's scale
(eigenvectors and singular vectors compared up to sign via their
products)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest

from helpers import assert_matches_cpu, matrix, on_cpu, run_on, spd

TOL = 1e-4
# The comparison: relative, and absolute relative to each result's scale.
SCALED = dict(rtol=TOL, atol=TOL, scaled=True)


SHAPES = [(4, 4), (3, 6, 6), (2, 2, 5, 5)]
shape_ids = ["x".join(map(str, s)) for s in SHAPES]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"stablehlo.cholesky-{s}" for s in shape_ids])
def test_cholesky(shape):
    assert_matches_cpu(lambda a: (jnp.linalg.cholesky(a), jsl.cholesky(a, lower=False)), spd(shape), **SCALED)


@pytest.mark.parametrize("lower,trans,left", [(True, 0, True), (False, 1, True), (True, 1, False),
                                              (False, 0, False)],
                         ids=["stablehlo.triangular_solve-lower", "stablehlo.triangular_solve-upper-T",
                              "stablehlo.triangular_solve-right-T", "stablehlo.triangular_solve-right"])
def test_triangular_solve(lower, trans, left):
    a, b = spd((3, 5, 5)), matrix((3, 5, 4) if left else (3, 4, 5), 1)
    tri = np.tril(a) if lower else np.triu(a)
    assert_matches_cpu(lambda a, b: jax.lax.linalg.triangular_solve(a, b, left_side=left, lower=lower,
                                                                    transpose_a=bool(trans)), tri, b, **SCALED)
    if left:
        assert_matches_cpu(lambda a, b: jsl.solve_triangular(a, b, lower=lower, trans=trans, unit_diagonal=True),
                           tri, b, **SCALED)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"custom_call.jax_ipu.lu-{s}" for s in shape_ids])
def test_solve_inv_det(shape):
    a = matrix(shape)
    assert_matches_cpu(lambda a: (jnp.linalg.solve(a, a[..., :1] + 1), jnp.linalg.inv(a)), a, **SCALED)
    if len(shape) > 2:   # unbatched det: its stablehlo.case on the ipu device is a known engine bug
        assert_matches_cpu(lambda a: (jnp.linalg.det(a), jnp.linalg.slogdet(a)), a, **SCALED)


@pytest.mark.parametrize("shape", [(5, 5), (6, 4), (4, 6)], ids=lambda s: "custom_call.jax_ipu.lu-" +
                         "x".join(map(str, s)))
def test_lu(shape):
    assert_matches_cpu(lambda a: (jsl.lu(a), jax.lax.linalg.lu(a)), matrix(shape), **SCALED)


@pytest.mark.parametrize("shape", [(5, 5), (6, 4), (4, 6), (2, 5, 3)],
                         ids=lambda s: "custom_call.Qr-" + "x".join(map(str, s)))
def test_qr(shape):
    assert_matches_cpu(lambda a: (jnp.linalg.qr(a), jnp.linalg.qr(a, mode="complete")), matrix(shape), **SCALED)


@pytest.mark.parametrize("shape", [(5, 5), (3, 6, 6)], ids=lambda s: "custom_call.jax_ipu.eigh-" +
                         "x".join(map(str, s)))
def test_eigh(ipu, shape):
    a = spd(shape)
    # Its own comparison: eigenvectors are unique up to sign.
    got, want = run_on(ipu, jnp.linalg.eigh, a), on_cpu(jnp.linalg.eigh, a)
    np.testing.assert_allclose(got[0], want[0], rtol=TOL, atol=TOL * np.abs(want[0]).max())
    g, w = got[1], want[1]   # eigenvectors: up to sign
    np.testing.assert_allclose(np.abs(np.swapaxes(g, -1, -2) @ w), np.broadcast_to(np.eye(shape[-1]), g.shape),
                               atol=1e-3)
    assert_matches_cpu(lambda a: jnp.linalg.eigvalsh(a), a, **SCALED)


@pytest.mark.parametrize("shape", [(5, 5), (6, 4), (2, 3, 5)], ids=lambda s: "custom_call.jax_ipu.svd-" +
                         "x".join(map(str, s)))
def test_svd(ipu, shape):
    a = matrix(shape)
    assert_matches_cpu(lambda a: jnp.linalg.svd(a, compute_uv=False), a, **SCALED)
    # Singular vectors are unique up to sign: their product against the input.
    u, s, vt = run_on(ipu, lambda a: jnp.linalg.svd(a, full_matrices=False), a)
    np.testing.assert_allclose(u * s[..., None, :] @ vt, a, atol=1e-4)
    got = run_on(ipu, lambda a: jnp.linalg.svd(a, full_matrices=True), a)
    assert got[0].shape[-1] == shape[-2] and got[2].shape[-2] == shape[-1]


def test_scipy_solvers():
    a, b = spd((5, 5)), matrix((5, 3), 1)
    assert_matches_cpu(lambda a, b: (jsl.cho_solve(jsl.cho_factor(a), b), jsl.lu_solve(jsl.lu_factor(a), b),
                                     jsl.solve(a, b, assume_a="pos"), jsl.inv(a), jnp.linalg.pinv(a)), a, b, **SCALED)


def test_f16_is_a_clear_error():
    a = jax.device_put(spd((4, 4)).astype(np.float16), jax.devices("ipu")[0])
    with pytest.raises(Exception, match=r"stablehlo.cholesky at .*float32 and complex64 only"):
        jax.jit(lambda a: jax.lax.linalg.cholesky(a, symmetrize_input=False))(a).block_until_ready()


EMPTY = {
    "norm-2-0x3": (lambda a: jnp.linalg.norm(a, ord=2), (0, 3)),
    "norm-nuc-3x0": (lambda a: jnp.linalg.norm(a, ord="nuc"), (3, 0)),
    "inv-0x0": (jnp.linalg.inv, (0, 0)),
    "inv-batch-0": (jnp.linalg.inv, (0, 2, 2)),
    "det-0x0": (jnp.linalg.det, (0, 0)),
    "solve-0x0": (lambda a: jnp.linalg.solve(a, jnp.ones((0, 2))), (0, 0)),
    "svd-0x3": (lambda a: jnp.linalg.svd(a, full_matrices=True), (0, 3)),
    "svd-values-4x0": (lambda a: jnp.linalg.svd(a, compute_uv=False), (4, 0)),
    "qr-0x3": (jnp.linalg.qr, (0, 3)),
    "qr-3x0": (jnp.linalg.qr, (3, 0)),
    "lu-3x0": (jax.lax.linalg.lu, (3, 0)),
    "eigh-0x0": (jnp.linalg.eigh, (0, 0)),
    "cholesky-2x0x0": (jnp.linalg.cholesky, (2, 0, 0)),
    "triangular_solve-rhs-3x0": (lambda a: jax.lax.linalg.triangular_solve(
        a[:3, :3] + 3 * jnp.eye(3), a[:3, :0], left_side=True, lower=True), (3, 3)),
}


@pytest.mark.parametrize("name", list(EMPTY))
def test_empty_matrices(name):
    """0-sized matrices give the shapes (and identity factors) XLA:CPU gives."""
    f, shape = EMPTY[name]
    assert_matches_cpu(f, matrix(shape), **SCALED)


SINGULAR = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]], np.float32)
ZERO_DIAGONAL = np.array([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [1.0, 3.0, 4.0]], np.float32)


@pytest.mark.parametrize("name,f,a", [
    ("inv", jnp.linalg.inv, SINGULAR),
    ("solve", lambda a: jnp.linalg.solve(a, jnp.ones(3)), SINGULAR),
    ("lu", jax.lax.linalg.lu, np.zeros((3, 3), np.float32)),
    ("det-grad", jax.grad(jnp.linalg.det), SINGULAR),
    ("triangular_solve", lambda a: jax.lax.linalg.triangular_solve(a, jnp.ones((3, 2)), left_side=True,
                                                                   lower=True), ZERO_DIAGONAL),
    ("triangular_solve-batched-right", lambda a: jax.lax.linalg.triangular_solve(
        jnp.stack([a, a.T]), jnp.ones((2, 4, 3)), left_side=False, lower=True), ZERO_DIAGONAL),
], ids=lambda v: v if isinstance(v, str) else "")
def test_singular_matrices_give_inf_and_nan_as_lapack(name, f, a):
    """No exception: the same inf/nan (and finite) entries as XLA:CPU."""
    assert_matches_cpu(f, a, **SCALED)
    assert any(not np.isfinite(w).all() for w in jax.tree.leaves(on_cpu(f, a))) or name in ("lu", "det-grad")


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (5, 5), (3, 4, 4)], ids=lambda s: "x".join(map(str, s)))
def test_tridiagonal(shape, lower):
    """lax.linalg.tridiagonal (LAPACK sytrd, as XLA:CPU): the reduced matrix
    with its Householder vectors, the diagonals and the taus."""
    a = spd(shape)
    assert_matches_cpu(lambda a: jax.lax.linalg.tridiagonal(a, lower=lower), a, **SCALED)


def test_tridiagonal_solve():
    rng = np.random.default_rng(1)
    dl, du = rng.standard_normal((2, 6)).astype(np.float32)
    dl[0] = du[-1] = 0
    d = (4 + rng.random(6)).astype(np.float32)
    b = rng.standard_normal((6, 3)).astype(np.float32)
    assert_matches_cpu(lambda dl, d, du, b: jax.lax.linalg.tridiagonal_solve(dl, d, du, b), dl, d, du, b, **SCALED)


@pytest.mark.parametrize("shape", [(2, 2), (3, 5, 5)], ids=str)
def test_boolean_matmul(shape):
    """dot_general of booleans is an OR of ANDs (jnp.linalg.matrix_power of bool)."""
    a = np.random.default_rng(2).random(shape) < 0.3
    got = assert_matches_cpu(lambda a: (jnp.linalg.matrix_power(a, 3), a @ a), a)
    assert all(g.dtype == np.bool_ for g in got)


@pytest.mark.parametrize("shape", [(4, 4), (2, 7, 7)])
def test_slogdet_second_order_gradients(ipu, shape):
    # A product read by a plain reduction (not the product's own sum over
    # its K-chunks) must not be left in the combined scratch form.
    from jax.test_util import check_grads
    a = matrix(shape, seed=5)
    with jax.default_device(ipu):
        check_grads(jnp.linalg.slogdet, (jax.device_put(a, ipu),), 2, atol=1e-1, rtol=2e-1)
    assert_matches_cpu(lambda x: jax.hessian(lambda y: jnp.linalg.slogdet(y)[1])(x), a, **SCALED)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("name", ["svdvals", "svd", "eigh", "eigvalsh", "pinv", "norm2"])
def test_svd_and_eigh_of_non_finite_matrices_give_nan_not_an_error(ipu, name, bad):
    """As on the CPU: a matrix with NaN or inf gives NaN results (LAPACK
    did not converge), never an exception that stops the program."""
    f = {"svdvals": lambda m: jnp.linalg.svd(m, compute_uv=False), "svd": jnp.linalg.svd,
         "eigh": jnp.linalg.eigh, "eigvalsh": jnp.linalg.eigvalsh, "pinv": jnp.linalg.pinv,
         "norm2": lambda m: jnp.linalg.norm(m, 2, axis=(-2, -1))}[name]
    x = np.eye(4, dtype=np.float32)
    x[1, 2] = x[2, 1] = bad
    got = jax.tree.leaves(jax.jit(f)(jax.device_put(np.stack([x, np.eye(4, dtype=np.float32)]), ipu)))
    want = jax.tree.leaves(jax.jit(f)(jax.device_put(np.stack([x, np.eye(4, dtype=np.float32)]),
                                                    jax.devices("cpu")[0])))
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        assert np.isnan(g[0]).any() and np.isfinite(g[1]).all()      # the bad matrix only
        np.testing.assert_allclose(np.abs(g[1]), np.abs(w[1]), atol=1e-5)


@pytest.mark.parametrize("name, f", [
    ("schur", jsl.schur), ("schur", jsl.sqrtm), ("hessenberg", jsl.hessenberg),
    ("geqp3", lambda m: jsl.qr(m, pivoting=True))], ids=["schur", "sqrtm", "hessenberg", "qr-pivoting"])
def test_linear_algebra_not_run_yet_fails_clearly(ipu, name, f):
    """Not JAX's bare 'MLIR translation rule not found': the op, what
    calls it, why, and to run it on the CPU."""
    x = jax.device_put(np.eye(3, dtype=np.float32) + 1, ipu)
    with pytest.raises(Exception, match=rf"lax\.linalg\.{name} .*does not run on the IPU.*Run it on the CPU"):
        jax.jit(f)(x)


# --- eig and factorisations of complex64 matrices ----------------------------------------------

def _complex_matrix(shape, seed=0):
    out = np.empty(shape, np.complex64)
    out.real, out.imag = matrix(shape, seed), matrix(shape, seed + 100)
    return out


def _sorted_eigenvalues(w):
    """Eigenvalues in one order on both sides (LAPACK's depends on rounding)."""
    w = np.asarray(w).astype(np.complex128)
    return np.take_along_axis(w, np.lexsort((np.round(w.imag, 3), np.round(w.real, 3)), axis=-1), -1)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_eigvals_and_eig_match_xla_cpu(dtype):
    """Eigenvalues (complex, conjugate pairs of a real matrix) equal
    XLA:CPU's up to their order; eigenvectors satisfy A v = w v and are unit
    vectors, as LAPACK's geev normalises them."""
    a = matrix((3, 6, 6), 2).astype(dtype) if dtype == np.float32 else _complex_matrix((3, 6, 6), 2)
    ipu = jax.devices("ipu")[0]
    w, (w2, v) = run_on(ipu, lambda m: (jnp.linalg.eigvals(m), jnp.linalg.eig(m)), a)
    want = on_cpu(jnp.linalg.eigvals, a)
    assert w.dtype == want.dtype == np.complex64 and v.dtype == np.complex64 and v.shape == a.shape
    scale = np.abs(want).max()
    np.testing.assert_allclose(_sorted_eigenvalues(w), _sorted_eigenvalues(want), atol=TOL * scale)
    np.testing.assert_allclose(_sorted_eigenvalues(w2), _sorted_eigenvalues(want), atol=TOL * scale)
    a64, v64 = a.astype(np.complex128), v.astype(np.complex128)
    np.testing.assert_allclose(a64 @ v64, v64 * w2[..., None, :], atol=TOL * scale)
    np.testing.assert_allclose(np.linalg.norm(v64, axis=-2), 1, atol=TOL)
    if dtype == np.float32:     # a real matrix's eigenvalues come in conjugate pairs
        np.testing.assert_allclose(_sorted_eigenvalues(w), _sorted_eigenvalues(np.conj(w)), atol=TOL * scale)


def test_eigvals_of_a_matrix_with_nan_is_nan_as_on_xla_cpu():
    a = np.stack([matrix((4, 4), 3), matrix((4, 4), 4)])
    a[0, 1, 2] = np.nan
    got = run_on(jax.devices("ipu")[0], jnp.linalg.eigvals, a)
    assert np.isnan(got[0]).all() and np.isfinite(got[1]).all()
    assert np.isnan(on_cpu(jnp.linalg.eigvals, a)[0]).all()


@pytest.mark.parametrize("name", ["lu", "qr", "cholesky", "eigh", "svd", "solve", "inv", "triangular_solve"])
def test_complex64_factorisations_match_xla_cpu(name):
    """Every factorisation on complex matrices (LAPACK's c- routines on
    both sides); eigenvectors and singular vectors up to phase through the
    products that fix them."""
    a = _complex_matrix((2, 5, 5), 5)
    hpd = a @ np.conj(np.swapaxes(a, -1, -2)) + 5 * np.eye(5, dtype=np.complex64)
    b = _complex_matrix((2, 5, 3), 6)
    f = {"lu": lambda m, r: jax.lax.linalg.lu(m),
         "qr": lambda m, r: jnp.abs(jnp.linalg.qr(m)[1]),
         "cholesky": lambda m, r: jnp.linalg.cholesky(r),
         "eigh": lambda m, r: (jnp.linalg.eigvalsh(r), jnp.abs(jnp.linalg.eigh(r)[1]) ** 2),
         "svd": lambda m, r: (jnp.linalg.svd(m, compute_uv=False), jnp.abs(jnp.linalg.svd(m)[0]) ** 2),
         "solve": lambda m, r: jnp.linalg.solve(m, b),
         "inv": lambda m, r: jnp.linalg.inv(r),
         "triangular_solve": lambda m, r: jsl.solve_triangular(jnp.tril(m) + 4 * jnp.eye(5), b, lower=True)}[name]
    assert_matches_cpu(f, a, hpd, **SCALED)
