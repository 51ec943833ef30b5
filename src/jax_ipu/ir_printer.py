"""jax_ipu.ir as readable text, for error messages and debugging:

    func @main(%3: tensor<4xf32>, %4: tensor<4xf32>) -> (tensor<4xf32>)
      %5 = sine(%3) : tensor<4xf32>  # t.py:6:11 (jit(f)/sin in g)
      %6 = reduce(%5, %2) {dimensions=[0]} : tensor<f32>  # t.py:7:4 (jit(f)/reduce_sum)
        ^(%7: tensor<f32>, %8: tensor<f32>):
          %9 = add(%7, %8) : tensor<f32>
          return %9
      return %6
"""
from __future__ import annotations

import numpy as np

from jax_ipu import ir

_INDENT = "  "


def format_module(module: ir.Module) -> str:
    header = f"module (replicas={module.num_replicas}, partitions={module.num_partitions})"
    return "\n".join([header] + [_format_function(f) for f in module.functions.values()])


def format_flat(args: list[ir.Value], ops: list, results: list[ir.Value]) -> str:
    """A flat op list (the compiler's form after legalize; a fused cluster
    is printed as its ops)."""
    lines = [f"func @main({', '.join(f'{_name(a)}: {a.type}' for a in args)})"]
    block = ir.Block(list(args), [op for node in ops for op in getattr(node, "ops", [node])], list(results))
    _format_block(block, 1, lines)
    return "\n".join(lines)


def _format_function(function: ir.Function) -> str:
    args = ", ".join(f"{_name(a)}: {a.type}{_arg_notes(function, i)}"
                     for i, a in enumerate(function.body.args))
    results = ", ".join(str(t) for t in function.result_types)
    lines = [f"func @{function.name}({args}) -> ({results})"]
    _format_block(function.body, 1, lines)
    return "\n".join(lines)


def _arg_notes(function: ir.Function, index: int) -> str:
    notes = []
    if function.arg_aliases and function.arg_aliases[index] is not None:
        notes.append(f"aliases result {function.arg_aliases[index]}")
    if function.arg_donors and function.arg_donors[index]:
        notes.append("donated")
    if function.arg_shardings and function.arg_shardings[index] is not None:
        notes.append(function.arg_shardings[index])
    return f" {{{', '.join(notes)}}}" if notes else ""


def _format_block(block: ir.Block, depth: int, lines: list[str]) -> None:
    indent = _INDENT * depth
    for op in block.ops:
        lines.append(f"{indent}{_format_op(op)}")
        for region in op.regions:
            args = ", ".join(f"{_name(a)}: {a.type}" for a in region.args)
            lines.append(f"{indent}{_INDENT}^({args}):")
            _format_block(region, depth + 2, lines)
    lines.append(f"{indent}return {', '.join(map(_name, block.results))}")


def _format_op(op: ir.Op) -> str:
    results = ", ".join(map(_name, op.results))
    attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in op.attrs.items())
    types = ", ".join(str(r.type) for r in op.results)
    return (f"{results + ' = ' if results else ''}{op.name}({', '.join(map(_name, op.operands))})"
            f"{' {' + attrs + '}' if attrs else ''} : {types}  # {op.loc}")


def _format_attr(value) -> str:
    if isinstance(value, np.ndarray):  # large constants shortened with "..."
        values = np.array2string(value, threshold=16, edgeitems=3, separator=",")
        return f"dense<{' '.join(values.split())}> : {ir.TensorType(value.shape, value.dtype)}"
    if isinstance(value, tuple):
        return f"[{', '.join(map(_format_attr, value))}]"
    return repr(value)


def _name(value: ir.Value) -> str:
    return f"%{value.id}"
