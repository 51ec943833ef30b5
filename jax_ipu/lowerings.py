"""JAX lowering rules for the ipu platform, where JAX 0.10.2 registers
rules only for named platforms (jax/_src/lax/linalg.py):

- cholesky, triangular_solve: JAX's generic rules emit stablehlo.cholesky
  and stablehlo.triangular_solve, which the compiler implements; nothing
  to register.
- geqrf, householder_product (QR): the generic rules emit custom_calls
  "Qr" and "ProductOfElementaryHouseholderReflectors", implemented too.
- lu: the generic rule is a Python loop of dynamic slices and scatters;
  eigh and svd have CPU/GPU (LAPACK, cuSOLVER) and TPU rules only. These
  get a custom_call "jax_ipu.<op>:<options>" here, which the compiler
  runs as a Factorize kernel (LAPACK's algorithm, as XLA:CPU)."""
from __future__ import annotations

PLATFORM = "ipu"


def _custom_call(name: str, **options):
    from jax._src.interpreters import mlir

    target = f"jax_ipu.{name}:" + ",".join(f"{k}={int(bool(v))}" for k, v in options.items())

    def rule(ctx, *operands):
        types = [mlir.aval_to_ir_type(ctx.module_context, aval) for aval in ctx.avals_out]
        return mlir.custom_call(target, result_types=types, operands=list(operands)).results
    return rule


def _lu(ctx, operand):
    return _custom_call("lu")(ctx, operand)


def _eigh(ctx, operand, *, lower, sort_eigenvalues, subset_by_index, algorithm=None):
    n = ctx.avals_in[0].shape[-1]
    if not (subset_by_index is None or tuple(subset_by_index) == (0, n)):
        raise NotImplementedError("eigh with subset_by_index is not supported on the ipu platform")
    return _custom_call("eigh", lower=lower)(ctx, operand)


def _svd(ctx, operand, *, full_matrices, compute_uv, subset_by_index, algorithm=None):
    m, n = ctx.avals_in[0].shape[-2:]
    if not (subset_by_index is None or tuple(subset_by_index) == (0, min(m, n))):
        raise NotImplementedError("svd with subset_by_index is not supported on the ipu platform")
    return _custom_call("svd", full_matrices=full_matrices, compute_uv=compute_uv)(ctx, operand)


def register() -> None:
    from jax._src.interpreters import mlir
    from jax._src.lax import linalg

    mlir.register_lowering(linalg.lu_p, _lu, platform=PLATFORM)
    mlir.register_lowering(linalg.eigh_p, _eigh, platform=PLATFORM)
    mlir.register_lowering(linalg.svd_p, _svd, platform=PLATFORM)
