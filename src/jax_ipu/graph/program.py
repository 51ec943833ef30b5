"""A compiled program: its graph (tensors, program tree) and the compiler's
estimates of its cycles, memory and work."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from jax_ipu import ir
from jax_ipu.graph.codelets_collectives import COLLECTIVES
from jax_ipu.graph.memory import MemoryReport
from jax_ipu.graph.programs import Copy, Execute, Sequence, StreamingCopy, leaves
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View


@dataclasses.dataclass(eq=False)
class Program:
    name: str
    target_name: str                   # the Target it was compiled for: name and tile count
    num_tiles: int
    tensors: list[Tensor]              # tensors[i].id == i
    body: Sequence                     # streams in, compute and exchange, streams out
    inputs: list[Tensor]
    outputs: list[View]
    input_types: list[ir.TensorType]
    output_types: list[ir.TensorType]
    aliases: dict[int, int]            # output index -> input index it may reuse
    # The aliases whose output can be written into the donated input's
    # buffer: the input is dead by the time the output is written.
    in_place: dict[int, int] = dataclasses.field(default_factory=dict)
    cycles: int = 0                    # one run, host transfers excluded (compiler.cost.static_cycles)
    # Loops whose trip count is known only at run time, left out of
    # `cycles` but for their condition: name, cycles_per_iteration, entered.
    unknown_trip_loops: list[dict] = dataclasses.field(default_factory=list)
    host_cycles: int = 0
    memory: MemoryReport | None = None
    flops: float = 0.0
    # Over several IPUs: (mesh, argument dims, result dims), the mesh axes
    # splitting each dimension of each argument and result (compiler.spmd).
    shardings: tuple | None = None
    bytes_accessed: float = 0.0
    transcendentals: float = 0.0
    # The results that are JAX's runtime tokens (empty bool arrays here).
    token_outputs: tuple[int, ...] = ()
    # The arguments and results held in streaming memory (JAX memory kind
    # pinned_host), not in tile SRAM.
    streaming_inputs: tuple[int, ...] = ()
    streaming_outputs: tuple[int, ...] = ()
    # The device-local layouts of the arguments and results: per one, its
    # dimensions major first (the tensor holds it transposed so), or None
    # for row-major; empty when all are row-major.
    input_layouts: tuple = ()
    output_layouts: tuple = ()
    # The ops computing on types the IPU emulates (bfloat16, complex64), by
    # what they emulate ("bfloat16 multiply", "complex64 dot_general"):
    # {"op", "count" (ops of the program), "cycles" (their steps' share,
    # each step counted once)}, costliest first.
    emulated: list[dict] = dataclasses.field(default_factory=list)

    def cost_analysis(self) -> dict[str, float]:
        """JAX's figures, and the cycles: estimated_cycles leaves out the
        iterations of loops whose trip count is unknown at compile time;
        the last two figures say how many such loops and what one iteration
        of each (as many times as a run enters it) adds."""
        return {"flops": float(self.flops), "bytes accessed": float(self.bytes_accessed),
                "transcendentals": float(self.transcendentals),
                "estimated_cycles": float(self.cycles),
                "loops_with_unknown_trip_count": float(len(self.unknown_trip_loops)),
                "estimated_cycles_per_unknown_loop_iteration": float(self.cycles_per_unknown_iteration)}

    @property
    def cycles_per_unknown_iteration(self) -> int:
        return sum(loop["cycles_per_iteration"] * (loop["entered"] or 1) for loop in self.unknown_trip_loops)

    def describe_cycles(self) -> str:
        """The static estimate in words, loops of unknown trip count named."""
        text = f"estimated {self.cycles} cycles"
        if self.unknown_trip_loops:
            text += (f" + {self.cycles_per_unknown_iteration} per iteration of {len(self.unknown_trip_loops)} "
                     f"loop(s) whose trip count is unknown at compile time")
        return text

    def describe_emulation(self) -> str:
        """The emulated ops and their cost in words ("" when none)."""
        if not self.emulated:
            return ""
        total = sum(e["cycles"] for e in self.emulated)
        share = f", {100 * total / self.cycles:.1f}% of the program's" if self.cycles else ""
        lines = [f"{self.name} emulates types the IPU lacks: {total:,} cycles{share} "
                 "(JAX_IPU_EMULATE_TYPES=0 refuses them)"]
        lines += [f"  {e['op']}: {e['count']} op{'s' * (e['count'] != 1)}, {e['cycles']:,} cycles"
                  for e in self.emulated]
        return "\n".join(lines)

    def memory_stats(self) -> dict[str, int]:
        """The figures PJRT's compiled-memory-stats call reports."""
        m = self.memory
        streaming_in = sum(t.nbytes for t in self.inputs if t.streaming)
        streaming_out = sum(v.size * v.dtype.itemsize for v in self.outputs if v.tensor.streaming)
        return {"code": int(m.code.sum()), "arguments": m.argument_bytes, "outputs": m.output_bytes,
                "aliased": m.aliased_bytes, "temporary": m.temporary_bytes, "peak": m.total_bytes,
                "streaming": m.streaming_bytes, "streaming_arguments": streaming_in,
                "streaming_outputs": streaming_out,
                "streaming_temporary": max(m.streaming_bytes - streaming_in - streaming_out, 0)}

    def summary(self) -> str:
        steps = list(leaves(self.body))
        compute_sets = [s for s in steps if isinstance(s, Execute)]
        copies = [s for s in steps if isinstance(s, Copy)]
        exchanged = sum(s.exchange_bytes for s in compute_sets + copies)
        lines = [
            f"program {self.name} on {self.target_name}: {len(self.tensors)} tensors, "
            f"{len(compute_sets)} compute sets, {len(copies)} copies",
            f"{self.describe_cycles()} (host transfers: {self.host_cycles} more), "
            f"{exchanged} B exchanged",
            self.memory.describe() if self.memory else "memory: not planned",
        ]
        # Collectives by XLA's names (all-reduce, all-gather...), which
        # readers of compiled.as_text() look for.
        for step in compute_sets:
            kernel = step.compute_set.kernel
            if isinstance(kernel, COLLECTIVES):
                name = re.sub(r"(?<!^)(?=[A-Z])", "-", type(kernel).__name__).lower()
                groups = getattr(kernel, "groups", None) or getattr(kernel, "pairs", ())
                lines.append(f"collective {name}({kernel.input.dtype}{list(kernel.input.shape)}) -> "
                             f"{kernel.out.dtype}{list(kernel.out.shape)} over {[list(g) for g in groups]}")
        for step in steps:
            if isinstance(step, Execute):
                cs = step.compute_set
                lines.append(f"  Execute {cs.name}: {len(cs.vertices)} vertices on "
                             f"{len(cs.tiles())} tiles, {step.cycles} cycles")
            elif isinstance(step, Copy):
                lines.append(f"  Copy -> {step.dst.name}: {step.exchange_bytes} B, {step.cycles} cycles")
            elif isinstance(step, StreamingCopy):
                nbytes = int(np.prod(step.sizes, dtype=np.int64)) * step.tile.dtype.itemsize
                lines.append(f"  StreamingCopy {step.name}: {nbytes} B, {step.cycles} cycles")
        return "\n".join(lines)
