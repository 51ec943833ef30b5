"""Compute sets and vertices. A vertex runs a codelet on one tile over
regions of tensors; a compute set is vertices that run in one BSP superstep.
Alongside its vertices, a compute set carries its `kernel`: what all of them
compute together (graph.codelets), which the engine executes in one
vectorised step instead of vertex by vertex."""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_ipu.graph.tensors import Tensor


@dataclasses.dataclass(eq=False)
class Region:
    """Intervals ([k, 2] array of flattened [start, stop)) of one tensor."""
    tensor: Tensor
    intervals: np.ndarray

    @property
    def num_elements(self) -> int:
        return int((self.intervals[:, 1] - self.intervals[:, 0]).sum())


@dataclasses.dataclass(eq=False)
class Vertex:
    codelet: str                   # e.g. "ElementwiseChain<float>", "MatMulPartial<half,float>"
    tile: int
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    cycles: int                    # estimated cycles on its tile (compiler.cost)


@dataclasses.dataclass(eq=False)
class DataDependentExchange:
    """The exchange of a compute set whose sources or destinations depend
    on indices known only at run time (popops multiSlice / multiUpdate):
    it replaces the exchange the vertices' read regions imply. Per tile,
    bytes sent and received over all `rounds` (each round an exchange and a
    sync), and the bytes of exchange buffers held while the step runs."""
    rounds: int
    sent: np.ndarray               # [tiles]
    received: np.ndarray           # [tiles]
    buffers: np.ndarray            # [tiles] one round's indices, staged elements or received updates


@dataclasses.dataclass(eq=False)
class ComputeSet:
    name: str
    vertices: list[Vertex]
    kernel: object                 # a graph.codelets kernel
    exchange: DataDependentExchange | None = None

    def tiles(self) -> np.ndarray:
        return np.unique([v.tile for v in self.vertices])
