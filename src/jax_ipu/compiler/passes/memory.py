"""The per-tile memory plan: always-live bytes (arguments, constants, code
and vertex state) plus the peak over program steps of the tensors live at
each step and the exchange buffers the step receives into. A program whose
peak exceeds a tile's SRAM fails with a report naming the tile."""
from __future__ import annotations

import numpy as np

from jax_ipu.errors import IpuOutOfMemoryError
from jax_ipu.graph.compute import VertexArray, vertex_tiles
from jax_ipu.graph.memory import MemoryReport
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.graph.tensors import Tensor
from jax_ipu.targets import Target


def _code_bytes(target: Target, steps: list) -> np.ndarray:
    vertices = np.zeros(target.num_tiles, dtype=np.int64)
    on_tiles: dict = {}        # codelet kind -> [tiles] of its vertices
    for step in (leaf for top in steps for leaf in leaves(top)):   # loop bodies too
        if isinstance(step, Execute):
            vs = step.compute_set.vertices
            tiles = vertex_tiles(vs)
            vertices += np.bincount(tiles, minlength=target.num_tiles)
            if isinstance(vs, VertexArray):
                on_tiles.setdefault(vs.codelet.split("[")[0], []).append(np.unique(tiles))
            else:
                for v in vs:
                    on_tiles.setdefault(v.codelet.split("[")[0], []).append([v.tile])
    # Code: each codelet kind once on each tile that runs it.
    code = np.zeros(target.num_tiles, dtype=np.int64)
    for parts in on_tiles.values():
        code[np.unique(np.concatenate(parts))] += target.code_bytes_per_codelet
    return code + vertices * target.vertex_state_bytes


def plan_memory(target: Target, tensors: list[Tensor], steps: list, inputs: list[Tensor],
                outputs: list, received: list[np.ndarray], first: np.ndarray, last: np.ndarray,
                aliased_bytes: int, in_place: dict[int, int] | None = None) -> MemoryReport:
    """in_place: output index -> donated input index of the outputs written
    into their input's memory (schedule.in_place_outputs); each that has
    its input's bytes on every tile takes no memory of its own."""
    tiles = target.num_tiles
    # Tensors in streaming memory take no tile SRAM.
    per_tile = [t.mapping.elements_per_tile(tiles) * t.dtype.itemsize if not t.streaming
                else np.zeros(tiles, dtype=np.int64) for t in tensors]
    always = {t.id for t in inputs} | {t.id for t in tensors if t.constant is not None}
    # An output written in place lives in its donated input's always-live
    # bytes (as XLA's buffer assignment shares an aliased pair's buffer).
    held_by_input = {outputs[o].tensor.id for o, i in (in_place or {}).items()
                     if not outputs[o].tensor.streaming and not inputs[i].streaming
                     and np.array_equal(per_tile[outputs[o].tensor.id], per_tile[inputs[i].id])}
    code = _code_bytes(target, steps)
    always_live = code + sum((per_tile[i] for i in always), np.zeros(tiles, dtype=np.int64))
    returned = {v.tensor.id for v in outputs}
    n = len(steps)
    delta = np.zeros((n + 1, tiles), dtype=np.int64)
    spans = []
    for t in tensors:
        if t.id in always or t.id in held_by_input or first[t.id] < 0:
            continue
        end = n - 1 if t.id in returned else max(last[t.id], first[t.id])
        delta[first[t.id]] += per_tile[t.id]
        delta[end + 1] -= per_tile[t.id]
        spans.append((t, first[t.id], end))
    live = np.cumsum(delta[:n], axis=0)
    exchange = np.stack(received) if n else np.zeros((0, tiles), dtype=np.int64)
    live += exchange
    peak = live.max(axis=0) if n else np.zeros(tiles, dtype=np.int64)
    liveness = live.sum(axis=1)
    at = int(np.argmax(liveness)) if n else -1
    max_tile = int(np.argmax(always_live + peak)) if tiles else 0
    return MemoryReport(
        bytes_per_tile=target.bytes_per_tile, always_live=always_live, not_always_live_peak=peak,
        code=code, argument_bytes=sum(t.nbytes for t in inputs if not t.streaming),
        output_bytes=sum(v.size * v.dtype.itemsize for v in outputs if not v.tensor.streaming),
        aliased_bytes=aliased_bytes, temporary_bytes=int(peak.sum()), liveness=liveness,
        liveness_exchange=exchange.sum(axis=1),
        liveness_on_max_tile=live[:, max_tile] if tiles else np.zeros(n, dtype=np.int64),
        live_at_peak=tuple(t.id for t, start, end in sorted(spans, key=lambda s: -s[0].nbytes)
                           if start <= at <= end),
        streaming_bytes=sum(t.nbytes for t in tensors if t.streaming))


def check_fits(report: MemoryReport, tensors: list[Tensor], target: Target, program=None) -> None:
    """Raises IpuOutOfMemoryError (carrying the report and the program, so
    that a profile can show it) unless the program fits."""
    if report.fits:
        return
    tile = report.max_tile
    on_tile = sorted(((int(t.mapping.elements_per_tile(target.num_tiles)[tile]) * t.dtype.itemsize, t)
                      for t in tensors if not t.streaming), key=lambda x: -x[0])
    largest = ", ".join(f"{t.name} {t.dtype.name}{list(t.shape)} ({n} B)" for n, t in on_tile[:3] if n)
    raise IpuOutOfMemoryError(
        f"out of memory on tile {tile} of {target.describe()}: it needs {report.max_bytes} bytes but "
        f"has {report.bytes_per_tile} ({report.always_live[tile]} always-live, "
        f"{report.not_always_live_peak[tile]} peak not-always-live). Largest tensors there: {largest}. "
        f"Use smaller arrays or batches, more tiles (JAX_IPU_MODEL_NUM_TILES) or IPUs, or a lower "
        f"available_memory_proportion for matmuls' plans (jax.jit(f).lower(...).compile(compiler_options="
        f"{{'available_memory_proportion': 0.3}}); default 0.6)", report, program)
