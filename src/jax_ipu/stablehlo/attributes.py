"""MLIR attributes as plain Python values.

Builtin attributes map by their Python class (the bindings hand out the
concrete class); StableHLO's structured attributes become the frozen
dataclasses below, with the StableHLO spec's field names; StableHLO enums
become their name ("GT", "FLOAT", "DEFAULT"). Anything else keeps its
printed form, so an unusual attribute never stops an import.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from jaxlib.mlir import ir as mlir
from jaxlib.mlir.dialects import stablehlo

from jax_ipu.ir import ConvDimensionNumbers, DotDimensionNumbers, GatherDimensionNumbers, Mesh, ScatterDimensionNumbers
from jax_ipu.stablehlo import constants

# Our dataclass -> (its binding class, binding property names that differ
# from the spec's).
_STRUCTURED: dict[type, tuple[type, dict[str, str]]] = {
    DotDimensionNumbers: (stablehlo.DotDimensionNumbers, {}),
    GatherDimensionNumbers: (stablehlo.GatherDimensionNumbers, {}),
    ScatterDimensionNumbers: (stablehlo.ScatterDimensionNumbers,
                              {"scatter_dims_to_operand_dims": "scattered_dims_to_operand_dims"}),
    ConvDimensionNumbers: (stablehlo.ConvDimensionNumbers, {}),
}

# Enums have no common binding class; their printed form is uniform:
# "#stablehlo<comparison_direction GT>".
_ENUM = re.compile(r"#(?:stablehlo|chlo)<\w+ (\w+)>")


def _structured(ours: type, binding: type, renames: dict[str, str], attr) -> Any:
    typed = binding(attr)
    values = {}
    for field in dataclasses.fields(ours):
        value = getattr(typed, renames.get(field.name, field.name))
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return ours(**values)


def _string(attr) -> str | bytes:
    """A string attribute's text, or its bytes when they are no UTF-8 (a
    custom call's backend_config may hold a pointer: JAX's InspectSharding)."""
    try:
        return attr.value
    except (RuntimeError, UnicodeDecodeError):
        return attr.value_bytes


def _dict(attr: mlir.DictAttr) -> dict[str, Any]:
    # Indexing, not NamedAttribute.attr: the latter aborts the process on a
    # complex constant instead of raising.
    return {named.name: convert(attr[named.name]) for named in attr}


_BUILTIN: dict[type, Callable[[Any], Any]] = {
    mlir.BoolAttr: lambda a: a.value,
    mlir.IntegerAttr: lambda a: a.value,
    mlir.FloatAttr: lambda a: a.value,
    mlir.StringAttr: lambda a: _string(a),
    mlir.FlatSymbolRefAttr: lambda a: a.value,
    mlir.UnitAttr: lambda a: True,
    mlir.ArrayAttr: lambda a: tuple(convert(x) for x in a),
    mlir.DictAttr: _dict,
    **{array: tuple for array in (
        mlir.DenseBoolArrayAttr, mlir.DenseI8ArrayAttr, mlir.DenseI16ArrayAttr,
        mlir.DenseI32ArrayAttr, mlir.DenseI64ArrayAttr,
        mlir.DenseF32ArrayAttr, mlir.DenseF64ArrayAttr)},
    **{dense: constants.to_numpy for dense in (
        mlir.DenseElementsAttr, mlir.DenseIntElementsAttr, mlir.DenseFPElementsAttr)},
}


def convert(attr) -> Any:
    """`attr` is a jaxlib MLIR attribute."""
    builtin = _BUILTIN.get(type(attr))
    if builtin is not None:
        return builtin(attr)
    for ours, (binding, renames) in _STRUCTURED.items():
        if binding.isinstance(attr):
            return _structured(ours, binding, renames, attr)
    text = str(attr)
    enum = _ENUM.fullmatch(text)
    return enum[1] if enum else text


def mesh(text: str) -> Mesh:
    """A Shardy mesh as printed: `<["x"=2, "y"=4]>`, `<["x"=2], device_ids=[1, 0]>`,
    `<[], device_ids=[3]>` (one device), or `mesh<...>` inline in a sharding."""
    axes, _, rest = text.partition("]")
    ids = re.search(r"device_ids\s*=\s*\[([^\]]*)\]", rest)
    return Mesh(tuple((axis, int(size)) for axis, size in re.findall(r'"([^"]+)"\s*=\s*(\d+)', axes)),
                tuple(int(i) for i in re.findall(r"-?\d+", ids[1])) if ids else None)
