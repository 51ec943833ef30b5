"""Reads the StableHLO programs JAX sends the plugin into jax_ipu.ir."""
from jax_ipu.stablehlo.importer import import_module
from jax_ipu.stablehlo.printer import format_module

__all__ = ["import_module", "format_module"]
