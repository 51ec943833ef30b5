"""First pass: one flat list of ops the IPU can run. Inlines func.call and
composites, drops ops that only annotate (sharding constraints, optimization
barriers), and rejects types the IPU does not hold, naming the op."""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_ipu import ir
from jax_ipu.errors import IpuCompileError, IpuUnimplementedError
from jax_ipu.model.targets import IPU_DTYPES

# Ops whose results are their operands, unchanged.
_IDENTITIES = {"optimization_barrier", "sdy.sharding_constraint", "sharding_constraint"}
_IDENTITY_CUSTOM_CALLS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"}
# Ops that run a function of the module, inlined: func.call, and composites
# (e.g. chlo.erf) by their decomposition.
_CALLEES = {"call": "callee", "composite": "decomposition"}


@dataclasses.dataclass
class FlatFunction:
    """main with every call inlined: `ops` in program order read `args`
    (or earlier results) and produce `results`."""
    args: list[ir.Value]
    ops: list[ir.Op]
    results: list[ir.Value]


def legalize(module: ir.Module) -> FlatFunction:
    main = module.main
    ops: list[ir.Op] = []
    results = _inline(module, main.body, {a: a for a in main.body.args}, ops, depth=0)
    for value in main.body.args:
        _check_type(value.type, next((op for op in ops if value in op.operands), None),
                    "an argument of the program")
    return FlatFunction(list(main.body.args), ops, results)


def _inline(module, block: ir.Block, env: dict, out: list, depth: int) -> list[ir.Value]:
    for op in block.ops:
        operands = [env[v] for v in op.operands]
        if op.name in _CALLEES:
            name = op.attrs.get(_CALLEES[op.name])
            callee = module.functions.get(name)
            if callee is None:
                raise IpuCompileError.for_op(op, f"calls unknown function {name!r}",
                                             "The program is malformed; please report it")
            inner = _inline(module, callee.body, dict(zip(callee.body.args, operands)), out, depth + 1)
            env.update(zip(op.results, inner))
        elif op.name in _IDENTITIES or (op.name == "custom_call"
                                        and op.attrs.get("call_target_name") in _IDENTITY_CUSTOM_CALLS):
            env.update(zip(op.results, operands))
        else:
            for value in list(op.operands) + list(op.results):
                _check_type(value.type, op, None)
            # A function called twice is inlined twice: its results need new values.
            results = [ir.Value(r.type) for r in op.results] if depth else op.results
            regions = [_inline_region(module, r, env, depth) for r in op.regions]
            out.append(ir.Op(op.name, operands, results, op.attrs, regions, op.loc))
            env.update(zip(op.results, results))
    return [env[v] for v in block.results]


def _inline_region(module, block: ir.Block, env: dict, depth: int) -> ir.Block:
    """A region (loop body, branch, comparator) with its calls inlined and
    the enclosing values it reads renamed as in `env`."""
    args = [ir.Value(a.type) for a in block.args] if depth else list(block.args)
    ops: list[ir.Op] = []
    results = _inline(module, block, {**env, **dict(zip(block.args, args))}, ops, depth)
    return ir.Block(args, ops, results)


def _check_type(t: ir.Type, op: ir.Op | None, where: str | None) -> None:
    if isinstance(t, ir.TokenType) or t.dtype in IPU_DTYPES:
        return
    name = ir.TYPE_NAMES.get(t.dtype, str(t.dtype))
    problem = f"the IPU has no {name} type (in {t})"
    if np.dtype(t.dtype).itemsize == 8 and t.dtype.kind in "fiu":
        advice = ("Use 32-bit types: keep JAX_ENABLE_X64 off (jax.config.update('jax_enable_x64', "
                  "False)) and cast to float32/int32. (Some JAX functions use 64-bit integers "
                  "internally, e.g. jax.random's counters; they cannot run on the IPU yet)")
    else:
        advice = "Use float32 or float16 (the IPU holds f32, f16, i32, u32, i16, u16, i8, u8, bool)"
    if op is None:
        raise IpuUnimplementedError(f"{where}: {problem}. {advice}")
    raise IpuUnimplementedError.for_op(op, problem, advice)
