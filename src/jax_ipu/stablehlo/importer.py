"""A StableHLO module -> jax_ipu.ir: one generic walk over ops, no per-op code.

Every op keeps its operands, results, attributes (see attributes.py) and
regions; what the compiler needs of an op's meaning it reads from there.
"""
from __future__ import annotations

import re
from typing import Any

from jaxlib.mlir import ir as mlir
from jaxlib.mlir.dialects import stablehlo

from jax_ipu import ir
from jax_ipu.errors import IpuCompileError, IpuUnimplementedError
from jax_ipu.stablehlo import attributes, constants, deserialize, locations
from jax_ipu.targets import USE_IPU_TYPES

# Terminators: their operands become the enclosing Block's results.
_RETURNS = {"func.return", "stablehlo.return", "sdy.return"}
_RENAMES = {"func.call": "call"}
_STABLEHLO_PREFIX = "stablehlo."
# Module-level ops that hold nothing to run.
_DECLARATIONS = {"sdy.mesh"}


def import_module(code: bytes) -> ir.Module:
    """`code` is what JAX hands a PJRT plugin to compile (or MLIR text)."""
    module = deserialize.parse(code)
    functions, meshes = {}, {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func":
            function = _FunctionImporter().run(op)
            functions[function.name] = function
        elif op.name == "sdy.mesh":
            meshes[op.attributes["sym_name"].value] = attributes.mesh(str(op.attributes["mesh"]))
        elif op.name not in _DECLARATIONS:
            raise IpuUnimplementedError(
                f"{op.name} at {locations.describe(str(op.location))}: module-level op not supported")
    if "main" not in functions:
        raise IpuCompileError("the program has no function named main, which JAX always emits; "
                              "was it produced by jax.jit?")
    attrs = module.operation.attributes
    return ir.Module(
        functions=functions,
        num_replicas=_int_attr(attrs, "mhlo.num_replicas", 1),
        num_partitions=_int_attr(attrs, "mhlo.num_partitions", 1),
        name=attrs["sym_name"].value if "sym_name" in attrs else "main", meshes=meshes)


def _value(attr):
    return attr.value


def _int_attr(attrs, name: str, default: int) -> int:
    return attrs[name].value if name in attrs else default


# Where JAX puts a sharding: Shardy (the default) or the older GSPMD.
_SHARDING_KEYS = ("sdy.sharding", "mhlo.sharding")


def _sharding_text(attr) -> str:
    """mhlo.sharding is a string; sdy.sharding an attribute we keep printed."""
    return attr.value if isinstance(attr, mlir.StringAttr) else str(attr)


def _attr_dicts(func_op, list_name: str, count: int) -> list:
    """Each argument's ("arg_attrs") or result's ("res_attrs") attributes."""
    if list_name in func_op.attributes:
        return list(func_op.attributes[list_name])
    return [{}] * count


def _lookup(attr_dict, keys: tuple[str, ...], convert, default):
    for key in keys:
        if key in attr_dict:
            return convert(attr_dict[key])
    return default


class _FunctionImporter:
    """Imports one func.func. Functions are isolated from above, so MLIR
    values map to ours per function; regions may use values of enclosing
    blocks (case and if branches do), so one map serves all nested blocks."""

    def __init__(self):
        self.values: dict[mlir.Value, ir.Value] = {}
        self.types: dict[mlir.Type, ir.Type] = {}

    def run(self, func_op) -> ir.Function:
        name = func_op.attributes["sym_name"].value
        where = f"function @{name}"
        body = self.block(func_op.regions[0], where)
        args = _attr_dicts(func_op, "arg_attrs", len(body.args))
        results = _attr_dicts(func_op, "res_attrs", len(body.results))
        return ir.Function(
            name=name,
            body=body,
            arg_aliases=[_lookup(a, ("tf.aliasing_output",), _value, None) for a in args],
            arg_donors=[_lookup(a, ("jax.buffer_donor",), _value, False) for a in args],
            arg_shardings=[_lookup(a, _SHARDING_KEYS, _sharding_text, None) for a in args],
            result_shardings=[_lookup(r, _SHARDING_KEYS, _sharding_text, None) for r in results],
            arg_memory_kinds=[_lookup(a, ("mhlo.memory_kind",), _value, None) for a in args],
            result_memory_kinds=[_lookup(r, ("mhlo.memory_kind",), _value, None) for r in results],
            arg_layout_modes=[_lookup(a, ("mhlo.layout_mode",), _value, None) for a in args],
            result_layout_modes=[_lookup(r, ("mhlo.layout_mode",), _value, None) for r in results],
        )

    def block(self, region, where: str) -> ir.Block:
        blocks = list(region.blocks)
        if len(blocks) != 1:
            raise IpuUnimplementedError(f"{where}: a region with {len(blocks)} blocks is not supported")
        mlir_block = blocks[0]
        block = ir.Block(args=[self.define(a, where) for a in mlir_block.arguments], ops=[], results=[])
        for op in mlir_block.operations:
            op = op.operation
            if op.name in _RETURNS:
                block.results = [self.values[v] for v in op.operands]
            else:
                block.ops.append(self.op(op))
        return block

    def op(self, op) -> ir.Op:
        loc = locations.describe(str(op.location))
        where = f"{op.name} at {loc}"
        name = _RENAMES.get(op.name) or op.name.removeprefix(_STABLEHLO_PREFIX)
        return ir.Op(
            name=name,
            operands=[self.values[v] for v in op.operands],
            results=[self.define(r, where) for r in op.results],
            attrs={key: _attribute(op, key, where) for key in op.attributes},
            regions=[self.block(r, where) for r in op.regions],
            loc=loc)

    def define(self, value, where: str) -> ir.Value:
        ours = ir.Value(self.type(value.type, where))
        self.values[value] = ours
        return ours

    def type(self, mlir_type, where: str) -> ir.Type:
        known = self.types.get(mlir_type)
        if known is None:
            known = self.types[mlir_type] = _convert_type(mlir_type, where)
        return known


def _convert_type(mlir_type, where: str) -> ir.Type:
    if stablehlo.TokenType.isinstance(mlir_type):
        return ir.TokenType()
    if not isinstance(mlir_type, mlir.RankedTensorType):
        raise IpuUnimplementedError(f"{where}: type {mlir_type} is not supported")
    if not mlir_type.has_static_shape:
        raise IpuUnimplementedError(
            f"{where}: type {mlir_type} is not supported; the IPU needs static shapes "
            "(avoid shape polymorphism and dynamic shapes)")
    element = str(mlir_type.element_type)
    dtype = ir.ELEMENT_TYPES.get(element)
    if dtype is None:
        raise IpuUnimplementedError(f"{where}: element type {element} is not supported. {USE_IPU_TYPES}; "
                                    "f64/i64 run as 32-bit types with JAX_IPU_F64_AS_F32=1")
    return ir.TensorType(tuple(mlir_type.shape), dtype)


# `key = dense<...> : tensor<...>` in an op's generic form; the element type
# may hold one more pair of brackets (complex<f32>).
_DENSE_ATTRIBUTE = r"{key} = (dense<.*?> : tensor<[^<>]*(?:<[^<>]*>)?>)"


def _attribute(op, key: str, where: str) -> Any:
    try:
        attr = op.attributes[key]
    except TypeError:
        # The bindings cannot wrap a dense constant of complex numbers; its
        # printed form still holds the value.
        asm = op.get_asm(print_generic_op_form=True, use_local_scope=True, assume_verified=True)
        dense = re.search(_DENSE_ATTRIBUTE.format(key=re.escape(key)), asm, re.S)
        if dense is None:
            raise IpuUnimplementedError(f"{where}: cannot read its attribute {key}") from None
        return constants.from_text(dense[1])
    return attributes.convert(attr)
