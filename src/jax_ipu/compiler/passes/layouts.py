"""Device-local layouts of a program's arguments and results (JAX's
`Format(Layout(major_to_minor=...))`, `Layout.AUTO`, mhlo.layout_mode).

An IPU array has no linear memory order of its own: its elements are
spread over tiles by the compiler's tile mapping. A layout is the order of
the dimensions in which the array's elements are laid out, major first: an
array in layout L is held as its transpose by L (np.transpose(x, L)), row
by row. So an argument in a layout other than row-major enters the program
as that transposed tensor and is read through the inverse transpose (a
rearranging copy when an op needs it in order, charged as any other), and
a result asked in such a layout is written transposed (a copy). The
executable reports the layouts it was compiled for, and buffers hold their
elements in their layout (pjrt.buffer).

AUTO (JAX leaves the layout to the compiler) is row-major, except for a
result that is a transpose, which takes the layout in which it is its
operand's elements in order (no copy, as XLA's layout assignment makes the
transpose a bitcast), and a result JAX constrained to a layout
(with_sharding_constraint with a Format), which takes that layout. Tiled
layouts (TPU tiles) are refused."""
from __future__ import annotations

import re

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.passes.fuse import reads_of
from jax_ipu.errors import IpuUnimplementedError

_XLA_LAYOUT = re.compile(r"\{\s*([\d\s,]*)\}")


def major_to_minor(mode: str | None, rank: int, where: str) -> tuple[int, ...] | None:
    """The layout an mhlo.layout_mode names, major first; None for
    row-major or left to the compiler ("auto")."""
    if mode is None or mode in ("default", "auto"):
        return None
    found = _XLA_LAYOUT.fullmatch(mode.strip())
    if found is None:
        raise IpuUnimplementedError(
            f"{where}: layout {mode!r} is not supported: an IPU array's layout is an order of its dimensions "
            "(Layout(major_to_minor=...)); tiled layouts and element sizes are TPU and GPU layouts")
    minor_first = tuple(int(d) for d in found.group(1).replace(",", " ").split())
    if sorted(minor_first) != list(range(rank)):
        raise IpuUnimplementedError(f"{where}: layout {mode} does not order the {rank} dimensions of the value")
    layout = minor_first[::-1]
    return None if layout == tuple(range(rank)) else layout


def _physical(t: ir.TensorType, layout: tuple[int, ...]) -> ir.TensorType:
    return ir.TensorType(tuple(t.shape[d] for d in layout), t.dtype)


def plan(flat, arg_modes: list, result_modes: list) -> tuple[tuple, tuple]:
    """Rewrites the flat program so that its arguments and results are the
    tensors the device holds (each transposed by its layout), and returns
    (the arguments' layouts, the results' layouts): major_to_minor or None
    (row-major) each, or () when all are row-major."""
    inputs = []
    prologue = []
    for i, arg in enumerate(flat.args):
        mode = arg_modes[i] if i < len(arg_modes) else None
        layout = major_to_minor(mode, len(arg.type.shape), f"argument {i}") \
            if isinstance(arg.type, ir.TensorType) else None
        inputs.append(layout)
        if layout is not None:
            held = ir.Value(_physical(arg.type, layout))
            prologue.append(ir.Op("transpose", [held], [arg], {"permutation": tuple(np.argsort(layout).tolist())},
                                  [], f"argument {i} (in layout {layout})"))
            flat.args[i] = held
    made = {r: op for op in flat.ops for r in op.results}
    outputs = []
    for i, value in enumerate(flat.results):
        if not isinstance(value.type, ir.TensorType):
            outputs.append(None)
            continue
        mode = result_modes[i] if i < len(result_modes) else None
        rank = len(value.type.shape)
        if mode == "auto":
            layout, value = _chosen(flat, value, made)
        else:
            layout = major_to_minor(mode, rank, f"result {i}")
            if layout is not None:
                held = ir.Value(_physical(value.type, layout))
                flat.ops.append(ir.Op("transpose", [value], [held], {"permutation": layout}, [],
                                      f"result {i} (in layout {layout})"))
                value = held
        outputs.append(layout)
        flat.results[i] = value
    flat.ops[:0] = prologue
    _drop_unread_transposes(flat)
    return (tuple(inputs) if any(inputs) else (), tuple(outputs) if any(outputs) else ())


def _drop_unread_transposes(flat) -> None:
    """Transposes whose results nothing reads any more (a result AUTO lays
    out as the transpose's operand)."""
    read = set(flat.results)
    for op in flat.ops:
        read.update(reads_of(op))
    flat.ops[:] = [op for op in flat.ops if op.name != "transpose" or op.results[0] in read]


def _chosen(flat, value: ir.Value, made: dict) -> tuple[tuple[int, ...] | None, ir.Value]:
    """The layout AUTO takes for a result, and the value the device holds."""
    rank = len(value.type.shape)
    constrained = flat.layouts.get(value)
    if constrained is not None:
        layout = major_to_minor("{" + ",".join(map(str, constrained)) + "}", rank, "a layout constraint")
        if layout is None:
            return None, value
        held = ir.Value(_physical(value.type, layout))
        flat.ops.append(ir.Op("transpose", [value], [held], {"permutation": layout}, [], "a layout constraint"))
        return layout, held
    op = made.get(value)
    if op is not None and op.name == "transpose":
        layout = tuple(np.argsort(op.attrs["permutation"]).tolist())
        if layout != tuple(range(rank)):
            return layout, op.operands[0]
    return None, value
