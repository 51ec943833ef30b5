"""The per-tile memory plan: always-live bytes (arguments, constants, code
and vertex state) plus the peak over program steps of the tensors live at
each step and the exchange buffers the step receives into. A program whose
peak exceeds a tile's SRAM fails with a report naming the tile."""
from __future__ import annotations

import numpy as np

from jax_ipu.compiler.passes.schedule import reads, writes
from jax_ipu.errors import IpuOutOfMemoryError
from jax_ipu.graph.compute import VertexArray
from jax_ipu.graph.memory import MemoryReport
from jax_ipu.graph.programs import CONTROL, Execute, children, leaves
from jax_ipu.graph.tensors import Tensor
from jax_ipu.targets import Target, codelet_code_key, codelet_memory


def _code_bytes(target: Target, steps: list) -> tuple[np.ndarray, np.ndarray]:
    """([tiles] code, [tiles] vertex state): each codelet's code once on
    each tile that runs it, each vertex's state (targets.codelet_memory:
    PopLibs' figures)."""
    state = np.zeros(target.num_tiles, dtype=np.int64)
    on_tiles: dict = {}        # codelet whose code runs -> ([tiles] of its vertices, its code bytes)
    seen = set()
    for step in (leaf for top in steps for leaf in leaves(top)):   # loop bodies too
        # A compute set run more than once (a serially split convolution's
        # steps) holds one set of vertices.
        if isinstance(step, Execute) and id(step.compute_set) not in seen:
            seen.add(id(step.compute_set))
            vs = step.compute_set.vertices
            if isinstance(vs, VertexArray):
                groups = [(vs.codelet, vs.tiles, len(vs.reads), len(vs.writes))]
            else:
                by_kind: dict = {}
                for v in vs:
                    by_kind.setdefault((v.codelet, len(v.reads), len(v.writes)), []).append(v.tile)
                groups = [(c, np.array(t, dtype=np.int64), r, w) for (c, r, w), t in by_kind.items()]
            for codelet, tiles, n_reads, n_writes in groups:
                code, per_vertex = codelet_memory(codelet, n_reads, n_writes)
                state += np.bincount(tiles, minlength=target.num_tiles) * per_vertex
                on_tiles.setdefault(codelet_code_key(codelet), ([], code))[0].append(np.unique(tiles))
    code = np.zeros(target.num_tiles, dtype=np.int64)
    for parts, nbytes in on_tiles.values():
        code[np.unique(np.concatenate(parts))] += nbytes
    return code, state


def _inner_spans(step, i: int, first: np.ndarray, last: np.ndarray, returned: set) -> tuple[dict, int]:
    """({tensor: (first, last) position among the step's leaf steps} of
    the tensors written first in control step i and read nowhere after it,
    the number of its leaf steps). A tensor read there before it is written
    (a loop's carried value, read in one iteration and written for the
    next), or that decides a branch, is live over all of the step."""
    found: dict[int, list] = {}
    decided = set()          # and those read before written
    for control in _controls(step):
        decided |= {c.id for c in (getattr(control, "predicate", None), getattr(control, "control", None)) if c}
    steps = list(leaves(step))
    for j, leaf in enumerate(steps):
        for t in reads(leaf):
            if t in found:
                found[t][1] = j
            else:
                found[t] = [0, j]
                decided.add(t)
        for t in writes(leaf):
            if t in found:
                found[t][1] = max(found[t][1], j)
            else:
                found[t] = [j, j]
    whole = len(steps) - 1
    spans = {}
    for t, (start, end) in found.items():
        if first[t] != i or last[t] > i or t in returned:
            continue
        spans[t] = (0, whole) if t in decided else (start, end)
    return spans, max(len(steps), 1)


def _controls(step):
    if isinstance(step, CONTROL):
        yield step
        for child in children(step):
            yield from _controls(child)


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
    code, vertex_state = _code_bytes(target, steps)
    code = code + vertex_state
    always_live = code + sum((per_tile[i] for i in always), np.zeros(tiles, dtype=np.int64))
    returned = {v.tensor.id for v in outputs}
    n = len(steps)
    delta = np.zeros((n + 1, tiles), dtype=np.int64)
    spans = []
    # A tensor that lives and dies inside one control step (a loop body's
    # intermediates) is live only over its part of that step's steps, not
    # over all of it: each loop's own peak is found over its steps.
    inner = {i: _inner_spans(step, i, first, last, returned) for i, step in enumerate(steps)
             if isinstance(step, CONTROL)}
    local = {t for found in inner.values() for t in found[0]}
    for t in tensors:
        if t.id in always or t.id in held_by_input or first[t.id] < 0 or t.id in local:
            continue
        end = n - 1 if t.id in returned else max(last[t.id], first[t.id])
        delta[first[t.id]] += per_tile[t.id]
        delta[end + 1] -= per_tile[t.id]
        spans.append((t.id, first[t.id], end))
    live = np.cumsum(delta[:n], axis=0)
    within_steps = {}      # control step -> ({tensor: span}, [tiles] its inner step at each tile's peak)
    for i, (found, length) in inner.items():
        found = {t: span for t, span in found.items() if t not in always and t not in held_by_input}
        if not found:
            continue
        within = np.zeros((length + 1, tiles), dtype=np.int64)
        for t, (start, end) in found.items():
            within[start] += per_tile[t]
            within[end + 1] -= per_tile[t]
        at = np.cumsum(within[:length], axis=0)
        live[i] += at.max(axis=0)
        within_steps[i] = (found, np.argmax(at, axis=0))
    exchange = np.stack(received) if n else np.zeros((0, tiles), dtype=np.int64)
    live += exchange
    peak = live.max(axis=0) if n else np.zeros(tiles, dtype=np.int64)
    liveness = live.sum(axis=1)
    at = int(np.argmax(liveness)) if n else -1
    max_tile = int(np.argmax(always_live + peak)) if tiles else 0
    max_tile_step = int(np.argmax(live[:, max_tile])) if n else -1
    on_max_tile = _live_at(max_tile_step, spans, within_steps, per_tile, max_tile)
    at_peak = _live_at(at, spans, within_steps, per_tile, None)
    return MemoryReport(
        bytes_per_tile=target.bytes_per_tile, always_live=always_live, not_always_live_peak=peak,
        code=code, argument_bytes=sum(t.nbytes for t in inputs if not t.streaming),
        output_bytes=sum(v.size * v.dtype.itemsize for v in outputs if not v.tensor.streaming),
        aliased_bytes=aliased_bytes, temporary_bytes=int(peak.sum()), liveness=liveness,
        liveness_exchange=exchange.sum(axis=1),
        liveness_on_max_tile=live[:, max_tile] if tiles else np.zeros(n, dtype=np.int64),
        live_at_peak=tuple(t for t, _ in at_peak), live_at_peak_bytes=tuple(b for _, b in at_peak),
        streaming_bytes=sum(t.nbytes for t in tensors if t.streaming),
        vertex_state=vertex_state, held_by_inputs=tuple(sorted(held_by_input)), peak_step=at,
        max_tile_step=max_tile_step, live_on_max_tile=tuple(t for t, _ in on_max_tile),
        live_on_max_tile_bytes=tuple(b for _, b in on_max_tile),
        exchange_on_max_tile=exchange[:, max_tile] if tiles else np.zeros(n, dtype=np.int64))


def _live_at(step: int, spans: list, within_steps: dict, per_tile: list, tile: int | None) -> list:
    """[(tensor id, bytes)] of the not-always-live tensors live at `step`,
    on `tile` or summed over all tiles, largest first; with the step's
    exchange buffers they add up to the step's live bytes there. Inside a
    control step, each tile's own inner peak counts (as the plan does)."""
    if step < 0:
        return []
    found = {}
    for t, start, end in spans:
        if start <= step <= end:
            found[t] = int(per_tile[t][tile] if tile is not None else per_tile[t].sum())
    inner, at = within_steps.get(step, ({}, None))
    for t, (start, end) in inner.items():
        live = (start <= at) & (at <= end)
        found[t] = int(per_tile[t][tile] * live[tile] if tile is not None else (per_tile[t] * live).sum())
    return sorted(((t, b) for t, b in found.items() if b), key=lambda x: -x[1])


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
