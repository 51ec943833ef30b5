"""The reference executors of the Model's kernels, one per kernel class
(graph/records.py), registered in model/registry.py as each module is
imported: plain numpy that says what the kernel computes, in the
partitioned form the compiler planned (K-chunk partial products, partial
reductions, then a fixed-order combine), so rounding follows the plan.
model/fast/ registers faster executors beside them."""
# Each module registers its executors (registry.reference) when imported.
from jax_ipu.model.executors import collectives, conv, elementwise, indexing, linalg, matmul, reduce  # noqa: F401
