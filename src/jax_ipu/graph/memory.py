"""The per-tile memory report of a Program (Poplar's memory profile, in
brief): always-live bytes and the peak of not-always-live bytes."""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(eq=False)
class MemoryReport:
    bytes_per_tile: int                  # the target's SRAM per tile
    always_live: np.ndarray              # [tiles] inputs, outputs, constants, code, vertex state
    not_always_live_peak: np.ndarray     # [tiles] peak of temporaries over program steps
    code: np.ndarray                     # [tiles] the part of always_live that is code + vertex state
    argument_bytes: int
    output_bytes: int
    aliased_bytes: int
    temporary_bytes: int                 # sum over tiles of the temporaries' peaks
    # Liveness over the program's top-level steps (profiles' liveness view):
    # not-always-live bytes on all tiles at each step, the part of them that
    # is exchange buffers, the same on the busiest tile, and the ids of the
    # tensors live at the step where the all-tile sum peaks.
    liveness: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    liveness_exchange: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    liveness_on_max_tile: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    live_at_peak: tuple = ()
    streaming_bytes: int = 0             # tensors in streaming memory, outside the tiles
    # Where the memory goes (benchmarks' --breakdown): the part of `code`
    # that is vertex state; the outputs held by their donated inputs'
    # bytes (in always_live, not counted again); the step where the
    # all-tile sum peaks (index into `liveness`) and each live tensor's
    # bytes there, summed over tiles (aligned with live_at_peak); the step
    # where the busiest tile peaks, the tensors live on it there and their
    # bytes on it; the busiest tile's exchange buffers at each step. At
    # either peak the tensors' bytes plus the exchange buffers are the
    # step's live bytes (liveness[peak_step], liveness_on_max_tile[max_tile_step]).
    vertex_state: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    held_by_inputs: tuple = ()
    peak_step: int = -1
    live_at_peak_bytes: tuple = ()
    max_tile_step: int = -1
    live_on_max_tile: tuple = ()
    live_on_max_tile_bytes: tuple = ()
    exchange_on_max_tile: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def peak(self) -> np.ndarray:
        """[tiles] always-live + peak not-always-live bytes."""
        return self.always_live + self.not_always_live_peak

    @property
    def max_tile(self) -> int:
        return int(np.argmax(self.peak)) if len(self.peak) else 0

    @property
    def max_bytes(self) -> int:
        return int(self.peak.max()) if len(self.peak) else 0

    @property
    def total_bytes(self) -> int:
        return int(self.peak.sum())

    @property
    def fits(self) -> bool:
        return self.max_bytes <= self.bytes_per_tile

    def describe(self) -> str:
        return (f"memory: peak {self.max_bytes} B on tile {self.max_tile} "
                f"(of {self.bytes_per_tile} B), {self.total_bytes} B in all tiles, "
                f"always-live max {int(self.always_live.max(initial=0))} B")
