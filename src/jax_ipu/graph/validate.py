"""Checks a Program's invariants: every element of every tensor mapped to
exactly one tile, and no compute set with two vertices that write the same
elements, or one reading what another writes (their order within a
superstep is undefined)."""
from __future__ import annotations

import numpy as np

from jax_ipu.errors import IpuCompileError
from jax_ipu.graph.compute import region_arrays
from jax_ipu.graph.programs import Execute, leaves


def validate(program, num_tiles: int | None = None) -> None:
    """Raises IpuCompileError naming the first broken invariant."""
    num_tiles = program.num_tiles if num_tiles is None else num_tiles
    for tensor in program.tensors:
        check_mapping(tensor, num_tiles)
    for step in leaves(program.body):
        if isinstance(step, Execute):
            check_compute_set(step.compute_set)


def _fail(problem: str):
    raise IpuCompileError(f"invalid IPU graph (a jax-ipu bug; please report it): {problem}")


def check_mapping(tensor, num_tiles: int) -> None:
    m = tensor.mapping
    if m.size != tensor.size:
        _fail(f"{tensor} has a mapping of {m.size} elements")
    if tensor.size == 0:
        return
    if len(m.starts) == 0 or m.starts[0] != 0 or m.stops[-1] != tensor.size:
        _fail(f"{tensor}: mapping does not cover elements 0..{tensor.size}")
    if np.any(m.stops <= m.starts):
        _fail(f"{tensor}: mapping has an empty or reversed interval")
    if np.any(m.starts[1:] != m.stops[:-1]):
        _fail(f"{tensor}: some elements are mapped twice or not at all")
    if np.any((m.tiles < 0) | (m.tiles >= num_tiles)):
        _fail(f"{tensor}: mapped to a tile outside 0..{num_tiles - 1}")


def _intervals_by_tensor(vertices, field: str) -> dict:
    """tensor -> (starts, stops, vertex index), sorted by start."""
    found: dict = {}
    for tensor, intervals, owners in region_arrays(vertices, field):
        found.setdefault(tensor, []).append((intervals, owners))
    out = {}
    for tensor, parts in found.items():
        intervals = np.concatenate([p for p, _ in parts])
        owners = np.concatenate([o for _, o in parts])
        order = np.argsort(intervals[:, 0], kind="stable")
        out[tensor] = (intervals[order, 0], intervals[order, 1], owners[order])
    return out


def check_compute_set(cs) -> None:
    writes = _intervals_by_tensor(cs.vertices, "writes")
    for tensor, (starts, stops, owners) in writes.items():
        clash = np.flatnonzero(starts[1:] < stops[:-1])
        if len(clash):
            i = clash[0]
            _fail(f"compute set {cs.name}: vertices {owners[i]} and {owners[i + 1]} both write "
                  f"{tensor.name}[{starts[i + 1]}:{stops[i]}]")
    for tensor, (r_starts, r_stops, readers) in _intervals_by_tensor(cs.vertices, "reads").items():
        if tensor not in writes:
            continue
        w_starts, w_stops, writers = writes[tensor]
        first = np.searchsorted(w_stops, r_starts, side="right")
        last = np.searchsorted(w_starts, r_stops, side="left")
        for k in np.flatnonzero(last > first):
            others = writers[first[k]:last[k]]
            if np.any(others != readers[k]):
                _fail(f"compute set {cs.name}: vertex {readers[k]} reads {tensor.name}"
                      f"[{r_starts[k]}:{r_stops[k]}] which vertex {others[others != readers[k]][0]} writes")
