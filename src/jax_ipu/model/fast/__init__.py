"""Speed machinery of the IPU Model that never changes a value: faster
executors registered beside the reference ones (model/registry.py), and
what the engine uses to run a program faster (see model-speed.md)."""
# Each executor module registers its executors (registry.fast, registry.fusion) when imported.
from jax_ipu.model.fast import chains, conv, matmul, reduce  # noqa: F401
