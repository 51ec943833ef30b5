"""Reads the StableHLO programs JAX sends the plugin into jax_ipu.ir."""
from jax_ipu.stablehlo.deserialize import module_text
from jax_ipu.stablehlo.importer import import_module

__all__ = ["import_module", "module_text"]
