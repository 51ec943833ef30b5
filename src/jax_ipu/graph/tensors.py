"""Tensors of the graph: variables (written by programs) and constants
(always-live data loaded with the program)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from jax_ipu.graph.mapping import TileMapping


@dataclasses.dataclass(eq=False)
class Tensor:
    id: int                       # index into the engine's storage
    name: str                     # debug name: "<op>/<role>" in the user's words
    shape: tuple[int, ...]
    dtype: np.dtype
    mapping: TileMapping
    constant: np.ndarray | None = None   # a constant's value (always-live)
    streaming: bool = False       # held in streaming memory (a remote buffer), not tile SRAM

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        dims = "x".join(map(str, self.shape))
        return f"Tensor#{self.id} {self.name} {self.dtype.name}[{dims}]"
