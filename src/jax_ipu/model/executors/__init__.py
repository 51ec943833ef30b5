"""The Model's executors of compute-set kernels (graph.codelets): each runs all the
vertices of one compute set at once with vectorised numpy, in the
partitioned form the compiler planned (K-chunk partial products, partial
reductions, then a fixed-order combine), so rounding follows the plan.

build(kernel) -> fn(state), `state` being the engine's list of arrays by
tensor id. Everything that can be decided before a run is decided here."""
from __future__ import annotations

from collections.abc import Callable

from jax_ipu.graph import codelets
# Each module registers its executors (common.register) when imported.
from jax_ipu.model.executors import collectives, elementwise, indexing, linalg, matmul, reduce  # noqa: F401
from jax_ipu.model.executors.common import EXECUTORS


def build(kernel, scratch: bool = False, whole: bool = False) -> Callable:
    """scratch: the kernel's output is only read, within a run, by kernels
    that make new arrays of it (the engine decides): for matmul partials,
    only by the matmul's reduction, which then finds them combined.
    whole: a product's rows in one block, never halves (it runs in a lane)."""
    if type(kernel) is codelets.MatMulPartials:
        return (matmul.build_combined if scratch else matmul.build)(kernel, whole)
    return EXECUTORS[type(kernel)](kernel)
