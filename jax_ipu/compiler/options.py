"""Options of one compilation (Poplar's engine and planner options, by the
names Graphcore's users know)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    # Share of each tile's SRAM a matmul may use for its operands and
    # partials (PopLibs' availableMemoryProportion).
    available_memory_proportion: float = 0.6
    # Poplar's debug.allowOutOfMemory: compile anyway and keep the report.
    allow_out_of_memory: bool = False
    # What to do with float64: "error" (the IPU has none).
    f64_policy: str = "error"
