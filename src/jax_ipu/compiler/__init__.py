"""The IPU compiler: ir.Module -> graph.Program, as a list of named passes.

Each pass is fn(c: Compilation) -> None and reads and fills the fields of
one Compilation; PASSES lists them in order, so the compiler reads top to
bottom. With CompileOptions.dump_to (JAX_IPU_DUMP_TO=DIR) the program is
written after every pass to DIR/<module>/<NN>-<pass>.txt, as XLA's
--xla_dump_to does.

passes/    whole-program passes (partition, legalize, fuse, lower, schedule,
           memory plan)
lowering/  one rule per op (registered by name), run by the lower pass
planners/  tile mappings and partitions the rules ask for
builder.py the graph being built; cost.py cycles of vertices and exchanges
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable
from typing import Any

from jax_ipu import ir
from jax_ipu.compiler.builder import Builder
from jax_ipu.compiler.cost import cost_steps, static_cycles

# Importing the rule modules registers their lowering rules.
from jax_ipu.compiler.lowering import (  # noqa: F401
    collectives,
    control,
    conv,
    host,
    indexing,
    layout,
    linalg,
    matmul,
    reduce,
    sort,
    windows,
)
from jax_ipu.compiler.options import CompileOptions
from jax_ipu.compiler.passes import layouts, spmd, streaming
from jax_ipu.compiler.passes.demote import demote_64bit
from jax_ipu.compiler.passes.dilate_post_conv import dilate_post_conv
from jax_ipu.compiler.passes.emulate import emulate_products
from jax_ipu.compiler.passes.fft import expand_ffts
from jax_ipu.compiler.passes.fold_transposes import fold_result_transposes
from jax_ipu.compiler.passes.fuse import Cluster, fuse
from jax_ipu.compiler.passes.legalize import FlatFunction, legalize
from jax_ipu.compiler.passes.lower import lower
from jax_ipu.compiler.passes.memory import check_fits, plan_memory
from jax_ipu.compiler.passes.rng import expand_rng
from jax_ipu.compiler.passes.schedule import hoist_updates, in_place_outputs, lifetimes, schedule
from jax_ipu.compiler.passes.tokens import remove_tokens
from jax_ipu.errors import IpuCompileError
from jax_ipu.graph.program import Program
from jax_ipu.graph.views import View
from jax_ipu.ir_printer import format_flat, format_module
from jax_ipu.targets import Target
from jax_ipu.utils import gc_pause

__all__ = ["CompileOptions", "Compilation", "PASSES", "compile_module"]
# The compile log: what each program emulates (INFO).
log = logging.getLogger("jax_ipu.compiler")


@dataclasses.dataclass(eq=False)
class Compilation:
    """What the passes read and fill, in the order they fill it."""
    module: ir.Module
    target: Target
    options: CompileOptions
    ranks: int = 1                       # IPUs the program runs on
    layout: Any = None                   # per-IPU shardings of inputs and outputs
    token_outputs: tuple = ()
    input_types: list = dataclasses.field(default_factory=list)    # as JAX sees them
    output_types: list = dataclasses.field(default_factory=list)
    flat: FlatFunction | None = None     # main with calls inlined, after legalize
    input_layouts: tuple = ()            # device-local layouts (major_to_minor or None
    output_layouts: tuple = ()           # each; empty: all row-major)
    streaming_inputs: tuple = ()         # indices of arguments and results held in
    streaming_outputs: tuple = ()        # streaming memory, not on the tiles
    nodes: list | None = None            # ops and fused element-wise clusters
    builder: Builder | None = None       # the graph: tensors and steps
    inputs: list = dataclasses.field(default_factory=list)
    outputs: list = dataclasses.field(default_factory=list)
    received: list | None = None         # exchange buffers per step and tile
    body: Any = None                     # the scheduled program
    host_cycles: int = 0
    aliases: dict = dataclasses.field(default_factory=dict)
    first: Any = None                    # tensor lifetimes, in steps
    last: Any = None
    in_place: dict = dataclasses.field(default_factory=dict)   # outputs written into donated inputs
    memory: Any = None                   # the per-tile memory plan
    emulated: list = dataclasses.field(default_factory=list)   # Program.emulated
    program: Program | None = None


def _partition(c: Compilation) -> None:
    """Several IPUs: the program each one runs, and the layout of its
    inputs and outputs."""
    c.ranks = c.module.num_replicas * c.module.num_partitions
    c.module, c.layout = spmd.partition(c.module, c.options.inspect_sharding)


def _remove_tokens(c: Compilation) -> None:
    c.token_outputs = tuple(i for i, t in enumerate(c.module.main.result_types) if isinstance(t, ir.TokenType))
    remove_tokens(c.module)


def _expand_rng(c: Compilation) -> None:
    expand_rng(c.module)              # 64-bit generator states as 32-bit word pairs


def _demote_64bit(c: Compilation) -> None:
    # The types JAX sees; the device may hold them narrower (f64_policy).
    c.input_types, c.output_types = list(c.module.main.arg_types), list(c.module.main.result_types)
    if c.options.f64_policy == "as_f32":
        demote_64bit(c.module)


def _legalize(c: Compilation) -> None:
    c.flat = legalize(c.module, c.options.emulate_types)


def _emulate_types(c: Compilation) -> None:
    """FFTs as products and element-wise ops on tiles (passes/fft.py), and
    bfloat16 and complex64 products as float32 ones (passes/emulate.py)."""
    c.flat.ops = emulate_products(expand_ffts(c.flat.ops))


def _plan_layouts(c: Compilation) -> None:
    """Arguments and results in a layout other than row-major: the device
    holds them transposed."""
    main = c.module.main
    c.input_layouts, c.output_layouts = layouts.plan(c.flat, main.arg_layout_modes, main.result_layout_modes)


def _plan_streaming(c: Compilation) -> None:
    """Values in streaming memory: the arguments and results JAX places
    there, and the moves between it and the tiles inside the program."""
    main = c.module.main
    c.streaming_inputs, c.streaming_outputs = streaming.plan(c.flat, main.arg_memory_kinds,
                                                             main.result_memory_kinds)


def _dilate_post_conv(c: Compilation) -> None:
    c.flat.ops = dilate_post_conv(c.flat.ops)


def _fold_transposes(c: Compilation) -> None:
    c.flat.ops = fold_result_transposes(c.flat.ops, c.flat.results)


def _fuse(c: Compilation) -> None:
    c.nodes = fuse(c.flat.ops)


def _lower(c: Compilation) -> None:
    b = c.builder = Builder(c.target, c.options)
    c.aliases = _aliases(c.module.main, c.flat.results)
    # Donated inputs whose updates one element-wise cluster computes (a
    # parameter and its momentum) share a mapping, so that the cluster's
    # results, mapped alike, can each be written into its own input's
    # memory (lowering/elementwise.py, schedule.in_place_outputs).
    donated = {c.flat.results[o]: i for o, i in c.aliases.items()
               if i not in c.streaming_inputs and c.flat.results[o].type == c.flat.args[i].type}
    mapped_as: dict[int, int] = {}
    for node in c.nodes:
        if isinstance(node, Cluster):
            group = sorted({donated[r] for op in node.ops for r in op.results if r in donated})
            for i in group[1:]:
                mapped_as.setdefault(i, mapped_as.get(group[0], group[0]))
    for i, arg in enumerate(c.flat.args):
        same = c.inputs[mapped_as[i]].mapping if i in mapped_as else None
        t = b.tensor(f"argument {i}", arg.type.shape, arg.type.dtype, same)
        t.streaming = i in c.streaming_inputs
        c.inputs.append(t)
        b.values[arg] = View(t)
    b.donors = {r: c.inputs[i] for r, i in donated.items()}
    lower(b, c.flat, c.nodes)
    c.outputs = [b.view(v, f"result {i}") for i, v in enumerate(c.flat.results)]


def _cost(c: Compilation) -> None:
    c.received = cost_steps(c.target, c.builder.steps)
    collectives.charge_links(c.target, c.builder.steps, c.ranks, c.options.link_domains)
    streaming.charge_streaming(c.target, c.builder.steps)
    c.emulated = _emulated(c.builder.emulated)


def _emulated(charges: list[tuple]) -> list[dict]:
    """The builder's charges (step or None, what, share of the step's
    cycles, source op) summed by what they emulate, costliest first."""
    by_what: dict[str, tuple[set, float]] = {}
    for step, what, share, source in charges:
        sources, cycles = by_what.get(what, (set(), 0.0))
        sources.add(source)
        by_what[what] = (sources, cycles + share * (getattr(step, "cycles", 0) or 0))
    # (Rounded down, so that the rows never sum past the program's cycles.)
    rows = [{"op": what, "count": len(sources), "cycles": int(cycles)}
            for what, (sources, cycles) in by_what.items()]
    return sorted(rows, key=lambda row: (-row["cycles"], row["op"]))


def _schedule(c: Compilation) -> None:
    b = c.builder
    b.steps[:], c.received = hoist_updates(b.steps, c.received, c.inputs, c.outputs, c.aliases)
    c.body, c.host_cycles = schedule(c.target, b.steps, c.inputs, c.outputs)


def _plan_memory(c: Compilation) -> None:
    b = c.builder
    c.first, c.last = lifetimes(b.steps, len(b.tensors))
    c.in_place = in_place_outputs(b.steps, c.inputs, c.outputs, c.aliases, c.first, c.last)
    c.memory = plan_memory(c.target, b.tensors, b.steps, c.inputs, c.outputs, c.received, c.first, c.last,
                           sum(c.inputs[i].nbytes for i in c.aliases.values()), c.in_place)
    for t in b.tensors:
        t.mapping.forget()     # compile-time caches, as large as the tensors


def _build_program(c: Compilation) -> None:
    b = c.builder
    cycles, unknown_loops = static_cycles(c.body)
    c.program = Program(
        name=c.module.name, target_name=c.target.name, num_tiles=c.target.num_tiles, tensors=b.tensors,
        body=c.body, inputs=c.inputs, outputs=c.outputs, input_types=c.input_types,
        output_types=c.output_types, aliases=c.aliases,
        in_place=c.in_place,
        cycles=cycles, unknown_trip_loops=unknown_loops, host_cycles=c.host_cycles, memory=c.memory,
        shardings=c.layout, flops=b.flops, transcendentals=b.transcendentals,
        bytes_accessed=float(sum(t.nbytes for t in b.tensors if t.constant is None)),
        token_outputs=c.token_outputs, streaming_inputs=c.streaming_inputs,
        streaming_outputs=c.streaming_outputs, input_layouts=c.input_layouts, output_layouts=c.output_layouts,
        emulated=c.emulated)


def _check_fits(c: Compilation) -> None:
    if not c.options.allow_out_of_memory:
        check_fits(c.memory, c.builder.tensors, c.target, c.program)


PASSES: list[tuple[str, Callable[[Compilation], None]]] = [
    ("partition", _partition),
    ("remove-tokens", _remove_tokens),
    ("expand-rng", _expand_rng),
    ("demote-64bit", _demote_64bit),
    ("legalize", _legalize),
    ("emulate-types", _emulate_types),
    ("plan-layouts", _plan_layouts),
    ("plan-streaming", _plan_streaming),
    ("dilate-post-conv", _dilate_post_conv),
    ("fold-transposes", _fold_transposes),
    ("fuse", _fuse),
    ("lower", _lower),
    ("cost", _cost),
    ("schedule", _schedule),
    ("plan-memory", _plan_memory),
    ("build-program", _build_program),
    ("check-fits", _check_fits),
]


def _aliases(function: ir.Function, results: list) -> dict[int, int]:
    """output index -> input index: JAX's tf.aliasing_output, then each
    plain donor paired with the first free output of its exact type."""
    aliases = {out: i for i, out in enumerate(function.arg_aliases) if out is not None}
    for i, donor in enumerate(function.arg_donors):
        if donor and i not in aliases.values():
            arg_type = function.body.args[i].type
            free = next((o for o, v in enumerate(results) if o not in aliases and v.type == arg_type), None)
            if free is not None:
                aliases[free] = i
    return aliases


def _dump(c: Compilation, index: int, name: str) -> None:
    """The program as the pass left it: the IR until lowering, then the
    graph's steps with their estimated cycles."""
    if c.builder is not None:
        lines = [f"{type(s).__name__} {getattr(s, 'name', '')} cycles={getattr(s, 'cycles', '')}"
                 for s in c.builder.steps]
        text = f"graph: {len(c.builder.tensors)} tensors, {len(c.builder.steps)} steps\n" + "\n".join(lines)
    elif c.nodes is not None or c.flat is not None:
        text = format_flat(c.flat.args, c.nodes if c.nodes is not None else c.flat.ops, c.flat.results)
    else:
        text = format_module(c.module)
    directory = os.path.join(c.options.dump_to, re.sub(r"[^\w.-]", "_", c.module.name or "module"))
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{index:02d}-{name}.txt"), "w") as f:
        f.write(text + "\n")


_DEFAULT_OPTIONS = CompileOptions()      # (frozen: one object serves every call)


def compile_module(module: ir.Module, target: Target, options: CompileOptions = _DEFAULT_OPTIONS) -> Program:
    if options.f64_policy not in ("error", "as_f32"):
        raise IpuCompileError(f"f64_policy={options.f64_policy!r} is not supported; use 'error' or 'as_f32'")
    dumping = bool(options.dump_to) and (options.dump_module_re is None
                                         or re.search(options.dump_module_re, module.name or "module") is not None)
    with gc_pause.paused():    # many objects, no cycles (see gc_pause)
        c = Compilation(module, target, options)
        for index, (name, run) in enumerate([("input", None)] + PASSES):
            if run is not None:
                run(c)
            if dumping and (options.dump_pass_re is None or re.search(options.dump_pass_re, name)):
                _dump(c, index, name)
    program = c.program
    if program is not None and program.emulated:     # once per program, in the compile log
        log.info("%s", program.describe_emulation())
    return program
