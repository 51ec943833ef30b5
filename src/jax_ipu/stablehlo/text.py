"""A compiled program in words for `compiled.as_text()`: the StableHLO JAX
sent, as MLIR text that XLA turns into HLO, with the IPU program the
compiler made from it (compute sets, copies, cycles, memory) as the
module's frontend attribute `ipu_program`, which HLO text prints."""
from __future__ import annotations

from jaxlib.mlir import ir as mlir

from jax_ipu.stablehlo import deserialize


def annotated(code: bytes, ipu_program: str) -> str:
    module = deserialize.parse(code)
    with module.context:
        module.operation.attributes["mhlo.frontend_attributes"] = mlir.DictAttr.get(
            {"ipu_program": mlir.StringAttr.get(ipu_program)})
        return module.operation.get_asm(enable_debug_info=False)
