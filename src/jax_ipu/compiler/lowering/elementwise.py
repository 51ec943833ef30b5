"""Lowers a fused cluster of element-wise ops to one compute set: an
ElementwiseChain kernel and one vertex per tile of the outputs' linear
mapping. Scalar operands become immediates (vertex state) or one element
broadcast to every tile; ops on constants only are folded here."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir, ops
from jax_ipu.compiler import cost
from jax_ipu.compiler.builder import Broadcast, Builder, ScalarBroadcast, Splat
from jax_ipu.compiler.passes.emulate import EMULATES
from jax_ipu.compiler.passes.fuse import Cluster
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.graph import codelets
from jax_ipu.graph.views import View
from jax_ipu.targets import COMPLEX64

# Attributes an element-wise op's semantics depend on.
SEMANTIC_ATTRS = ("comparison_direction", "compare_type", "exponent_bits", "mantissa_bits")


def _check(op: ir.Op) -> None:
    complex_values = any(v.type.dtype == COMPLEX64 for v in list(op.operands) + list(op.results))
    if complex_values and op.name not in ops.COMPLEX_OPS:
        raise IpuUnimplementedError.for_op(
            op, f"stablehlo.{op.name} is not defined on complex numbers",
            "Apply it to the real and imaginary parts (jnp.real, jnp.imag)")
    if complex_values and op.name == "compare" and op.attrs.get("comparison_direction") not in ("EQ", "NE"):
        raise IpuUnimplementedError.for_op(
            op, "complex numbers have no order (only EQ and NE compare them)",
            "Compare their real and imaginary parts, or their absolute values")
    if op.name == "bitcast_convert":
        src, dst = op.operands[0].type, op.results[0].type
        if src.dtype.itemsize != dst.dtype.itemsize:
            raise IpuUnimplementedError.for_op(
                op, f"bitcast between types of different widths ({src} -> {dst}) is not supported",
                "Bitcast between types of one width, or file an issue")


def evaluate(op: str, args: list, dtype: np.dtype, attrs: dict):
    """One element-wise op on numpy values, as the engine computes it."""
    fn, _ = ops.implementation(op, [np.asarray(a).dtype for a in args], dtype, attrs)
    with np.errstate(all="ignore"):
        return np.asarray(fn(*args)).astype(dtype)


def lower_cluster(b: Builder, cluster: Cluster, used_outside: set) -> None:
    shape = cluster.shape
    size = int(np.prod(shape, dtype=np.int64))
    inputs: list = []                     # views read on each tile, then immediates
    input_index: dict = {}
    instructions: list[tuple] = []        # (op, args, dtype, attrs); args are refs
    refs: dict[ir.Value, tuple] = {}      # ("imm", array) | ("in", i) | ("ins", j)
    sources: list[ir.Op] = []             # the op of each instruction

    def operand(v: ir.Value) -> tuple:
        if v in refs:
            return refs[v]
        lowered = b.values[v]
        if isinstance(lowered, Splat):
            return ("imm", lowered.value)
        source = lowered.scalar if isinstance(lowered, ScalarBroadcast) else \
            lowered.view() if isinstance(lowered, Broadcast) else lowered
        if source.size == 1 and source.shape != shape:
            source = source.then("reshape", ())
        key = (source.tensor.id, source.ops)
        if key not in input_index:
            input_index[key] = len(inputs)
            inputs.append(source)
        return ("in", input_index[key])

    for op in cluster.ops:
        _check(op)
        args = [operand(v) for v in op.operands]
        dtype = op.results[0].type.dtype
        attrs = tuple(sorted((k, op.attrs[k]) for k in SEMANTIC_ATTRS if k in op.attrs))
        if all(kind == "imm" for kind, _ in args):   # fold ops on constants
            refs[op.results[0]] = ("imm", evaluate(op.name, [a for _, a in args], dtype, dict(attrs)))
        else:
            instructions.append((op.name, args, dtype, attrs))
            sources.append(op)
            refs[op.results[0]] = ("ins", len(instructions) - 1)

    views = list(inputs)
    immediates = [a for _, args, _, _ in instructions for kind, a in args if kind == "imm"]
    first_result = len(views) + len(immediates)
    next_immediate = iter(range(len(views), first_result))

    def register(kind, x) -> int:
        return {"in": lambda: x, "imm": lambda: next(next_immediate), "ins": lambda: first_result + x}[kind]()
    program = tuple(codelets.Instruction(name, tuple(register(*a) for a in args), np.dtype(dtype), attrs)
                    for name, args, dtype, attrs in instructions)

    outputs = []
    for op in cluster.ops:
        value = op.results[0]
        if value in used_outside:
            kind, x = refs[value]
            if kind == "imm":
                b.values[value] = Splat(np.asarray(x), shape)
            else:
                outputs.append((value, first_result + x, op))
    if not outputs:
        return
    # An update of a donated input (an optimiser's, a running statistic's)
    # mapped as that input, so that it can be written into its memory
    # (schedule.in_place_outputs, the memory plan) rather than beside it.
    donor = next((b.donors[v] for v, _, _ in outputs if v in b.donors), None)
    tile_mapping = donor.mapping if donor is not None else b.output_mapping(size, outputs[0][0].type.dtype, views)
    reused = None if donor is not None else _dying_operand(b, cluster, views, outputs, shape)
    # In place only where that exchanges no more than the usual mapping
    # (the operands mapped as the reused one hold at least as many bytes)
    # and puts a vertex on no tile the usual mapping leaves out (each
    # vertex's state is always live on its tile).
    if (reused is not None and np.isin(reused.mapping.tiles, tile_mapping.tiles).all()
            and _local_bytes(reused.mapping, views, size) >= _local_bytes(tile_mapping, views, size)):
        tile_mapping = reused.mapping
    else:
        reused = None
    tensors = []
    for value, reg, op in outputs:
        if reused is not None and reused.dtype == value.type.dtype:
            t, reused = reused, None
        else:
            t = b.tensor(f"{op.name}@{op.loc}", shape, value.type.dtype, tile_mapping)
        b.values[value] = View(t)
        tensors.append((reg, t))
    names = [i.op for i in program]
    dtype = tensors[0][1].dtype
    kernel = codelets.ElementwiseChain(tuple(views) + tuple(np.asarray(i) for i in immediates),
                                       program, tuple(tensors), shape)
    spec = [(op.name, [v.type.dtype for v in op.operands], op.results[0].type.dtype) for op in sources]
    vertices = b.vertices_over(f"ElementwiseChain<{dtype.name}>[{','.join(names)}]",
                               [t for _, t in tensors], views,
                               lambda n: cost.chain_cycles(b.target, n, dtype, spec)[0])
    b.flops += size * len(program)
    b.transcendentals += size * sum(name in ops.TRANSCENDENTAL for name in names)
    step = b.execute(f"fused {'+'.join(dict.fromkeys(names))} @{cluster.ops[-1].loc}", kernel, vertices)
    _charge_emulation(b, step, sources, spec, dtype, int(tile_mapping.elements_per_tile(b.target.num_tiles).max()))


def _dying_operand(b: Builder, cluster: Cluster, views: list, outputs: list, shape: tuple):
    """An operand tensor the cluster may write one of its results into, as
    popops' in-place element-wise ops and XLA's buffer assignment reuse an
    operand's buffer: of a result's shape and type, made in the block being
    lowered, read by the cluster only whole and in its own element order
    (each element then read and written by the one vertex that holds it),
    and read by nothing after the cluster. None if there is none."""
    types = {value.type.dtype for value, _, _ in outputs}
    for v in views:
        if not isinstance(v, View) or not v.ops == () or v.tensor.shape != shape or v.tensor.dtype not in types:
            continue
        t = v.tensor
        if any(isinstance(w, View) and w.tensor is t and w.ops for w in views):
            continue             # also read in another order or shape
        if b.writable_after(t, cluster.ops):
            return t
    return None


def _local_bytes(m, views: list, size: int) -> int:
    """The bytes of the whole operands mapped as m: read where they are
    when the cluster's vertices follow m."""
    return sum(v.size * v.dtype.itemsize for v in views
               if isinstance(v, View) and v.is_whole_tensor and v.size == size and m.same_runs(v.tensor.mapping))


def _charge_emulation(b: Builder, step, sources: list[ir.Op], spec: list[tuple], dtype: np.dtype, n: int) -> None:
    """The chain's emulated instructions, charged to what they emulate: an
    op an expansion made (passes/emulate.py) to the op it stands for, an
    element-wise op on an emulated type to itself; each its share of the
    busiest vertex's cycles."""
    tags = []
    for op, (name, operands, out) in zip(sources, spec, strict=True):
        kind = ops.emulates(name, operands, out)
        tags.append(op.attrs.get(EMULATES) or ((f"{kind} {name}", id(op)) if kind else None))
    if not any(tags):
        return
    _, emulated = cost.chain_cycles(b.target, n, dtype, spec)
    each = [c or cost.worker_cycles(b.target, n, ops.cycles_per_vector([name]), b.target.vector_width(dtype))
            for c, (name, _, _) in zip(emulated, spec, strict=True)]
    total = sum(each) or 1
    shares: dict = {}
    for tag, c in zip(tags, each, strict=True):
        if tag:
            shares[tag] = shares.get(tag, 0) + c / total
    b.emulated.extend((step, what, share, source) for (what, source), share in shares.items())
