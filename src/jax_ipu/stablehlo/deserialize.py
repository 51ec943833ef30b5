"""The bytes JAX sends a PJRT plugin -> a jaxlib MLIR module.

JAX sends a StableHLO portable artifact (VHLO bytecode); tests and tools
may send the MLIR text or bytecode of a stablehlo module. Both start from a
fresh MLIR context: contexts keep every constant they ever saw, so a shared
one would grow with each compile.
"""
from __future__ import annotations

from jaxlib.mlir import ir as mlir
from jaxlib.mlir._mlir_libs import _jax_mlir_ext
from jaxlib.mlir.dialects import chlo, sdy, stablehlo

from jax_ipu.errors import IpuCompileError

_BYTECODE_MAGIC = b"ML\xefR"  # every MLIR bytecode, portable artifacts included


def _new_context(diagnostics: list[str]) -> mlir.Context:
    context = mlir.Context()
    # func and the other upstream dialects: jaxlib has no public way to add
    # them, so do what JAX itself does (jax._src.interpreters.mlir).
    registry = mlir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context.append_dialect_registry(registry)
    for dialect in (stablehlo, chlo, sdy):  # sdy: JAX's meshes and shardings
        dialect.register_dialect(context)
    # Keep MLIR's complaints for our error message instead of stderr.
    context.attach_diagnostic_handler(lambda d: diagnostics.append(f"{d.location}: {d.message}") or True)
    return context


def parse(code: bytes | str) -> mlir.Module:
    """Raises IpuCompileError when `code` is not a stablehlo module."""
    diagnostics: list[str] = []
    context = _new_context(diagnostics)
    raw = code.encode() if isinstance(code, str) else bytes(code)
    try:
        if raw.startswith(_BYTECODE_MAGIC):
            try:
                return stablehlo.deserialize_portable_artifact(context, raw)
            except ValueError:
                pass  # not VHLO: perhaps plain MLIR bytecode
        return mlir.Module.parse(raw, context)
    except mlir.MLIRError as error:
        details = "\n  ".join(diagnostics + [str(error)])
        raise IpuCompileError(
            f"cannot read the program JAX sent as StableHLO:\n  {details}\n"
            f"jax-ipu reads StableHLO up to version {stablehlo.get_current_version()}; "
            "check that jax and jaxlib are the versions jax-ipu supports.") from None


def module_text(code: bytes | str) -> str:
    """The program JAX sent, as StableHLO text (what lowered.as_text() shows)."""
    return str(parse(code))
