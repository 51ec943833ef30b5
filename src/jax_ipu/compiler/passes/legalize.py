"""First pass: one flat list of ops the IPU can run. Inlines func.call and
composites, drops ops that only annotate (sharding constraints), and
rejects types the IPU does not hold, naming the op. Optimization barriers
stay: they compute nothing, but no fusion joins values across one (see
lowering/control.py), which is what keeps jax.checkpoint's recomputation
separate from the forward pass it repeats."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from jax_ipu import ir
from jax_ipu.errors import IpuCompileError, IpuUnimplementedError
from jax_ipu.targets import EMULATED_DTYPES, IPU_DTYPES, USE_IPU_TYPES

# Ops whose results are their operands, unchanged.
# (sdy.sharding_group, shard_alike's mark, has no results: it goes.)
_IDENTITIES = {"sdy.sharding_constraint", "sharding_constraint", "sdy.sharding_group"}
# dce_sink (lax.dce_sink, checkify) only keeps its operands alive: it has no results.
_IDENTITY_CUSTOM_CALLS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "dce_sink"}
# Products whose boolean form (an OR of ANDs) runs as an int32 count.
_COUNTING = {"dot_general", "convolution"}
# What a program refused for an emulated type (JAX_IPU_EMULATE_TYPES=0) can do.
_NATIVE_ONLY = ("jax-ipu emulates it unless asked for hardware-native programs only: unset "
                "JAX_IPU_EMULATE_TYPES (or pass compiler_options={'emulate_types': True}), or use float32 or "
                "float16")
# Ops refused whatever their types: (problem, what to do).
_UNSUPPORTED_OPS = {
    "rng": ("stablehlo.rng (lax.rng_uniform, a stateful generator without a key) is not "
            "supported", "Use jax.random with a key (e.g. jax.random.uniform(key, shape)): its bits are "
                         "the CPU backend's"),
}
# Ops that run a function of the module, inlined: func.call, and composites
# (e.g. chlo.erf) by their decomposition.
_CALLEES = {"call": "callee", "composite": "decomposition"}


@dataclasses.dataclass
class FlatFunction:
    """main with every call inlined: `ops` in program order read `args`
    (or earlier results) and produce `results`. `layouts`: the values JAX
    constrained to a device-local layout (with_sharding_constraint with a
    Format, an XLA LayoutConstraint), as minor_to_major."""
    args: list[ir.Value]
    ops: list[ir.Op]
    results: list[ir.Value]
    layouts: dict = dataclasses.field(default_factory=dict)


def legalize(module: ir.Module, emulate_types: bool = True) -> FlatFunction:
    """`emulate_types`: bfloat16 and complex64 pass (the compiler emulates
    them), else they are refused like every type the IPU lacks."""
    main = module.main
    ops: list[ir.Op] = []
    layouts: dict = {}
    allowed = IPU_DTYPES | EMULATED_DTYPES if emulate_types else IPU_DTYPES
    results = _inline(module, main.body, {a: a for a in main.body.args}, ops, depth=0, site=None, allowed=allowed,
                     layouts=layouts)
    # Each argument's first reader, found in one pass (a search of every op
    # per argument took seconds of a large model's compile).
    arguments = set(main.body.args)
    reader: dict = {}
    for op in ops:
        for v in op.operands:
            if v in arguments and v not in reader:
                reader[v] = op
    for value in main.body.args:
        _check_type(value.type, reader.get(value), "an argument of the program", allowed)
    for value in results:   # a constant returned as it is has no reader checking it
        _check_type(value.type, None, "a result of the program", allowed)
    return FlatFunction(list(main.body.args), ops, results, layouts)


_SOURCE_POSITION = re.compile(r":\d+:\d+")


def _located(op: ir.Op, site: str | None) -> ir.Op:
    """The op, placed at its call site when its own location names no
    source line (JAX gives ops inside some called functions, e.g. jnp.fft's,
    only the function's name)."""
    if site is None or _SOURCE_POSITION.search(op.loc):
        return op
    return dataclasses.replace(op, loc=f"{site} (via {op.loc})")


def _inline(module, block: ir.Block, env: dict, out: list, depth: int, site: str | None,
            allowed: frozenset, layouts: dict | None = None) -> list[ir.Value]:
    for op in block.ops:
        op = _located(op, site)
        operands = [env[v] for v in op.operands]
        if op.name in _CALLEES:
            name = op.attrs.get(_CALLEES[op.name])
            callee = module.functions.get(name)
            if callee is None:
                raise IpuCompileError.for_op(op, f"calls unknown function {name!r}",
                                             "The program is malformed; please report it")
            inner_site = op.loc if _SOURCE_POSITION.search(op.loc) else site
            inner = _inline(module, callee.body, dict(zip(callee.body.args, operands, strict=True)), out, depth + 1,
                            inner_site, allowed, layouts)
            env.update(zip(op.results, inner, strict=True))
        elif op.name == "custom_call" and op.attrs.get("call_target_name") == "LayoutConstraint":
            # Values have no layout inside a program (their tensors' tile
            # mappings are the compiler's): the constraint is an identity
            # that says which layout a result JAX leaves to the compiler takes.
            env.update(zip(op.results, operands, strict=True))
            if layouts is not None and op.attrs.get("result_layouts"):
                layouts[operands[0]] = tuple(int(d) for d in op.attrs["result_layouts"][0])
        elif op.name in _IDENTITIES or (op.name == "custom_call"
                                        and op.attrs.get("call_target_name") in _IDENTITY_CUSTOM_CALLS):
            # (A sink such as dce_sink has operands and no results.)
            env.update(zip(op.results, operands, strict=False))
        elif op.name in _UNSUPPORTED_OPS:
            raise IpuUnimplementedError.for_op(op, *_UNSUPPORTED_OPS[op.name])
        else:
            # A constant's type is checked at its readers: JAX gives hoisted
            # constants the location of the jit call, the reader the user's line.
            for value in list(op.operands) + (list(op.results) if op.name != "constant" else []):
                _check_type(value.type, op, None, allowed)
            # A function called twice is inlined twice: its results need new values.
            results = [ir.Value(r.type) for r in op.results] if depth else op.results
            regions = [_inline_region(module, r, env, depth, site, allowed) for r in op.regions]
            if op.name == "bitcast_convert" and _widths_differ(op):
                _bitcast_of_widths(operands[0], results[0], op.loc, out)
            elif op.name in _COUNTING and all(v.type.dtype == np.bool_ for v in operands + results):
                _boolean_dot(op, operands, results[0], out)
            elif op.name == "custom_call" and op.attrs.get("call_target_name") == "ApproxTopK":
                _approx_top_k(module, op, operands, results, out, site, allowed)
            else:
                out.append(ir.Op(op.name, operands, results, op.attrs, regions, op.loc))
            env.update(zip(op.results, results, strict=True))
    return [env[v] for v in block.results]


def _inline_region(module, block: ir.Block, env: dict, depth: int, site: str | None, allowed: frozenset) -> ir.Block:
    """A region (loop body, branch, comparator) with its calls inlined and
    the enclosing values it reads renamed as in `env`."""
    args = [ir.Value(a.type) for a in block.args] if depth else list(block.args)
    ops: list[ir.Op] = []
    results = _inline(module, block, {**env, **dict(zip(block.args, args, strict=True))}, ops, depth, site, allowed)
    return ir.Block(args, ops, results)


def _approx_top_k(module, op: ir.Op, operands: list, results: list, out: list, site: str | None,
                  allowed: frozenset) -> None:
    """lax.approx_max_k / approx_min_k, exactly, as XLA:CPU computes them:
    the operands sorted along the reduction dimension by the comparator,
    the first top_k of each kept."""
    config = op.attrs.get("mhlo.backend_config") or {}
    names = op.attrs.get("called_computations") or ()
    comparator = module.functions.get(names[0]) if names else None
    if comparator is None or "reduction_dim" not in config:
        raise IpuCompileError.for_op(op, "ApproxTopK without its comparator or reduction dimension",
                                     "The program is malformed; please report it")
    region = _inline_region(module, comparator.body, {}, 1, site, allowed)    # depth 1: values of its own
    n = len(results)
    ordered = [ir.Value(v.type) for v in operands[:n]]
    out.append(ir.Op("sort", operands[:n], ordered, {"dimension": int(config["reduction_dim"]), "is_stable": True},
                     [region], op.loc))
    for value, result in zip(ordered, results, strict=True):
        rank = len(result.type.shape)
        out.append(ir.Op("slice", [value], [result], {"start_indices": (0,) * rank,
                                                      "limit_indices": tuple(result.type.shape),
                                                      "strides": (1,) * rank}, [], op.loc))


def _check_type(t: ir.Type, op: ir.Op | None, where: str | None, allowed: frozenset) -> None:
    if isinstance(t, ir.TokenType) or t.dtype in allowed:
        return
    name = ir.TYPE_NAMES.get(t.dtype, str(t.dtype))
    problem = f"the IPU has no {name} type (in {t})"
    if t.dtype in EMULATED_DTYPES:
        problem = f"the IPU has no {name} arithmetic (in {t}), and this program asks for native types only"
        advice = _NATIVE_ONLY
    elif t.dtype == np.complex128:
        advice = ("Use complex64 (emulated as pairs of float32): keep JAX_ENABLE_X64 off, or cast with "
                  "x.astype(jnp.complex64)")
    elif np.dtype(t.dtype).itemsize == 8 and t.dtype.kind in "fiu":
        advice = ("Use 32-bit types: keep JAX_ENABLE_X64 off (jax.config.update('jax_enable_x64', "
                  "False)) and cast to float32/int32; or opt into running 64-bit types as 32-bit ones "
                  "with JAX_IPU_F64_AS_F32=1 (or jax_ipu.set_f64_as_f32(True))")
    else:
        advice = USE_IPU_TYPES
    if op is None:
        raise IpuUnimplementedError(f"{where}: {problem}. {advice}")
    raise IpuUnimplementedError.for_op(op, problem, advice)


def _widths_differ(op: ir.Op) -> bool:
    src, dst = op.operands[0].type, op.results[0].type
    return (isinstance(src, ir.TensorType) and src.dtype.itemsize != dst.dtype.itemsize
            and np.bool_ not in (src.dtype, dst.dtype))


def _bitcast_of_widths(x: ir.Value, result: ir.Value, loc: str, out: list) -> None:
    """bitcast_convert between element types of different widths, as XLA
    defines it (little-endian): a wide element is the narrow elements along
    a new minor axis, the first in its low bits. Written as element-wise
    shifts of unsigned integers of the two widths."""
    def emit(name, operands, shape, dtype, **attrs) -> ir.Value:
        value = ir.Value(ir.TensorType(tuple(shape), np.dtype(dtype)))
        out.append(ir.Op(name, list(operands), [value], attrs, [], loc))
        return value

    def as_type(v: ir.Value, dtype) -> ir.Value:   # same width
        return v if v.type.dtype == np.dtype(dtype) else emit("bitcast_convert", [v], v.type.shape, dtype)

    src, dst = x.type, result.type
    wide, narrow = (src, dst) if src.dtype.itemsize > dst.dtype.itemsize else (dst, src)
    bits = 8 * narrow.dtype.itemsize
    k = wide.dtype.itemsize // narrow.dtype.itemsize
    u_wide, u_narrow = np.dtype(f"u{wide.dtype.itemsize}"), np.dtype(f"u{narrow.dtype.itemsize}")
    shape = wide.shape
    rank = len(shape)
    if src is wide:
        full = shape + (k,)
        spread = emit("broadcast_in_dim", [as_type(x, u_wide)], full, u_wide, broadcast_dimensions=tuple(range(rank)))
        amounts = emit("constant", [], (k,), u_wide, value=(np.arange(k) * bits).astype(u_wide))
        amounts = emit("broadcast_in_dim", [amounts], full, u_wide, broadcast_dimensions=(rank,))
        parts = emit("convert", [emit("shift_right_logical", [spread, amounts], full, u_wide)], full, u_narrow)
        final = as_type(parts, dst.dtype)
    else:
        u = as_type(x, u_narrow)
        total = None
        for j in range(k):
            part = emit("slice", [u], shape + (1,), u_narrow, start_indices=(0,) * rank + (j,),
                        limit_indices=shape + (j + 1,), strides=(1,) * (rank + 1))
            part = emit("convert", [emit("reshape", [part], shape, u_narrow)], shape, u_wide)
            if j:
                amount = emit("constant", [], (), u_wide, value=np.array(j * bits, u_wide))
                amount = emit("broadcast_in_dim", [amount], shape, u_wide, broadcast_dimensions=())
                part = emit("shift_left", [part, amount], shape, u_wide)
            total = part if total is None else emit("or", [total, part], shape, u_wide)
        final = as_type(total, dst.dtype)
    # The last op makes `result` itself.
    last = out[-1] if out and out[-1].results[0] is final else None
    if last is not None:
        last.results[0] = result
    else:
        out.append(ir.Op("bitcast_convert", [final], [result], {}, [], loc))


def _boolean_dot(op: ir.Op, operands: list, result: ir.Value, out: list) -> None:
    """dot_general or convolution of booleans, as XLA: an OR of ANDs, i.e.
    the int32 op on the 0/1 values compared with zero."""
    def emit(name, args, t, **attrs) -> ir.Value:
        value = ir.Value(t)
        out.append(ir.Op(name, list(args), [value], attrs, [], op.loc))
        return value
    i32 = np.dtype(np.int32)
    lhs, rhs = (emit("convert", [v], ir.TensorType(v.type.shape, i32)) for v in operands)
    shape = result.type.shape
    counts = emit(op.name, [lhs, rhs], ir.TensorType(shape, i32), **op.attrs)
    zero = emit("broadcast_in_dim", [emit("constant", [], ir.TensorType((), i32), value=np.array(0, i32))],
                ir.TensorType(shape, i32), broadcast_dimensions=())
    out.append(ir.Op("compare", [counts, zero], [result], {"comparison_direction": "NE", "compare_type": "SIGNED"},
                     [], op.loc))
