"""Options of one compilation (Poplar's engine and planner options, by the
names Graphcore's users know)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    # Share of each tile's SRAM a matmul may use for its operands and
    # partials (PopLibs' availableMemoryProportion).
    available_memory_proportion: float = 0.6
    # The type of convolutions' and matmuls' partial sums of float16
    # operands (Poplar's partialsType): "float" (float32, PopLibs' default)
    # or "half" (float16, taken when the result is float16 too; the AMP
    # then runs twice as many conv units: docs/semantics.md).
    partials_type: str = "float"
    # Poplar's debug.allowOutOfMemory: compile anyway and keep the report.
    allow_out_of_memory: bool = False
    # What to do with 64-bit types, which the IPU lacks: "error" (refuse
    # them, naming the op) or "as_f32" (run f64/i64/u64 as f32/i32/u32:
    # JAX_IPU_F64_AS_F32, see compiler.passes.demote).
    f64_policy: str = "error"
    # Types the IPU holds but cannot compute in (bfloat16, complex64): True
    # emulates them (compiler/passes/emulate.py, ops.py), False refuses them
    # at compile time, naming the op (JAX_IPU_EMULATE_TYPES=0).
    emulate_types: bool = True
    # A directory to write the IR after every pass to (JAX_IPU_DUMP_TO), as
    # XLA's --xla_dump_to; None writes nothing. The regular expressions, when
    # set, choose the programs and the passes dumped (XLA's
    # xla_dump_hlo_module_re and xla_dump_hlo_pass_re).
    dump_to: str | None = None
    dump_module_re: str | None = None
    dump_pass_re: str | None = None
    # The IPU-Link domain (IPU-POD) of each rank's IPU: collectives over
    # ranks of several domains cross GW-Links. Empty: all in one domain.
    link_domains: tuple = ()
    # Called with (a custom call's backend_config, the sharding layout of its
    # operand) for each jax.debug.inspect_array_sharding the SPMD pass meets
    # (the PJRT layer hands it to JAX's callback); None: they are dropped.
    inspect_sharding: Callable | None = dataclasses.field(default=None, compare=False, repr=False)
