"""The IPU compiler: ir.Module -> graph.Program, in passes (one module each):
legalize (dtypes, calls) -> fuse (element-wise clusters) -> lower with plans
(tile mappings, matmul and reduction partitioning) -> cost (cycles) ->
schedule (BSP steps, streams) -> memory plan (per tile, liveness)."""
from __future__ import annotations

from jax_ipu import ir
from jax_ipu.compiler import spmd, streaming
from jax_ipu.compiler.builder import Builder
from jax_ipu.compiler.collectives import charge_links
from jax_ipu.compiler.cost import cost_steps, static_cycles
from jax_ipu.compiler.demote import demote_64bit
from jax_ipu.compiler.fold_transposes import fold_result_transposes
from jax_ipu.compiler.fuse import fuse
from jax_ipu.compiler.legalize import legalize
from jax_ipu.compiler.lower import lower
from jax_ipu.compiler.memory import check_fits, plan_memory
from jax_ipu.compiler.options import CompileOptions
from jax_ipu.compiler.rng import expand_rng
from jax_ipu.compiler.tokens import remove_tokens
from jax_ipu.compiler.schedule import in_place_outputs, lifetimes, schedule
from jax_ipu.errors import IpuCompileError, IpuUnimplementedError
from jax_ipu.graph.program import Program
from jax_ipu.graph.views import View
from jax_ipu.model.targets import Target

__all__ = ["CompileOptions", "compile_module"]


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


def compile_module(module: ir.Module, target: Target, options: CompileOptions = CompileOptions()) -> Program:
    if options.f64_policy not in ("error", "as_f32"):
        raise IpuCompileError(f"f64_policy={options.f64_policy!r} is not supported; use 'error' or 'as_f32'")
    ranks = module.num_replicas * module.num_partitions
    module, layout = spmd.partition(module)     # several IPUs: the program each one runs
    token_outputs = tuple(i for i, t in enumerate(module.main.result_types) if isinstance(t, ir.TokenType))
    remove_tokens(module)
    expand_rng(module)              # 64-bit generator states as 32-bit word pairs
    main = module.main
    # The types JAX sees; the device may hold them narrower (f64_policy).
    input_types, output_types = list(main.arg_types), list(main.result_types)
    if options.f64_policy == "as_f32":
        demote_64bit(module)
    flat = legalize(module)
    streaming_inputs, streaming_outputs = streaming.plan(flat, main.arg_memory_kinds, main.result_memory_kinds)
    flat.ops = fold_result_transposes(flat.ops, flat.results)
    nodes = fuse(flat.ops)
    b = Builder(target, options)
    inputs = []
    for i, arg in enumerate(flat.args):
        t = b.tensor(f"argument {i}", arg.type.shape, arg.type.dtype)
        t.streaming = i in streaming_inputs
        inputs.append(t)
        b.values[arg] = View(t)
    lower(b, flat, nodes)
    outputs = [b.view(v, f"result {i}") for i, v in enumerate(flat.results)]
    received = cost_steps(target, b.steps)
    charge_links(target, b.steps, ranks)
    streaming.charge_streaming(target, b.steps)
    body, host_cycles = schedule(target, b.steps, inputs, outputs)
    cycles, unknown_loops = static_cycles(body)
    first, last = lifetimes(b.steps, len(b.tensors))
    aliases = _aliases(main, flat.results)
    memory = plan_memory(target, b.tensors, b.steps, inputs, outputs, received, first, last,
                         sum(inputs[i].nbytes for i in aliases.values()))
    for t in b.tensors:
        t.mapping.forget()     # compile-time caches, as large as the tensors
    program = Program(
        name=module.name, target_name=target.name, num_tiles=target.num_tiles, tensors=b.tensors, body=body, inputs=inputs,
        outputs=outputs, input_types=input_types, output_types=output_types,
        aliases=aliases, in_place=in_place_outputs(b.steps, inputs, outputs, aliases, first, last),
        cycles=cycles, unknown_trip_loops=unknown_loops, host_cycles=host_cycles, memory=memory,
        shardings=layout, flops=b.flops, transcendentals=b.transcendentals,
        bytes_accessed=float(sum(t.nbytes for t in b.tensors if t.constant is None)),
        token_outputs=token_outputs, streaming_inputs=streaming_inputs, streaming_outputs=streaming_outputs)
    if not options.allow_out_of_memory:
        check_fits(memory, b.tensors, target, program)
    return program
