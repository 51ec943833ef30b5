"""The compiler's input: a small typed SSA graph of StableHLO ops.

The importer (jax_ipu.stablehlo) builds it from the bytes JAX sends; the
compiler (jax_ipu.compiler) reads it. It knows nothing of tiles or of PJRT.

Op names are StableHLO's without the dialect prefix ("add", "dot_general",
"reduce", ...); attributes are plain Python values (ints, tuples, strings,
numpy arrays for dense constants, small dataclasses for dimension numbers).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import ml_dtypes
import numpy as np

# StableHLO element type name -> numpy dtype. The IPU holds only some of
# these (see jax_ipu.targets.IPU_DTYPES); the rest exist so that the
# compiler can name them in a clear error.
ELEMENT_TYPES: dict[str, np.dtype] = {
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8), "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32), "i64": np.dtype(np.int64),
    "ui8": np.dtype(np.uint8), "ui16": np.dtype(np.uint16),
    "ui32": np.dtype(np.uint32), "ui64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16), "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64), "bf16": np.dtype(ml_dtypes.bfloat16),
    "complex<f32>": np.dtype(np.complex64),
    "complex<f64>": np.dtype(np.complex128),
}
TYPE_NAMES: dict[np.dtype, str] = {v: k for k, v in ELEMENT_TYPES.items()}

# The custom_call target of host callbacks (jax_ipu.frontend.callbacks emits it, the
# compiler lowers it to a HostCall).
HOST_CALLBACK_TARGET = "jax_ipu.host_callback"

# Dimension numbers of dot_general, gather, scatter and convolution, with
# the StableHLO spec's field names.

@dataclasses.dataclass(frozen=True)
class DotDimensionNumbers:
    lhs_batching_dimensions: tuple[int, ...]
    rhs_batching_dimensions: tuple[int, ...]
    lhs_contracting_dimensions: tuple[int, ...]
    rhs_contracting_dimensions: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class GatherDimensionNumbers:
    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    operand_batching_dims: tuple[int, ...]
    start_indices_batching_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    index_vector_dim: int


@dataclasses.dataclass(frozen=True)
class ScatterDimensionNumbers:
    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int


@dataclasses.dataclass(frozen=True)
class ConvDimensionNumbers:
    input_batch_dimension: int
    input_feature_dimension: int
    input_spatial_dimensions: tuple[int, ...]
    kernel_input_feature_dimension: int
    kernel_output_feature_dimension: int
    kernel_spatial_dimensions: tuple[int, ...]
    output_batch_dimension: int
    output_feature_dimension: int
    output_spatial_dimensions: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Mesh:
    """A Shardy mesh: named axes with their sizes, major first, and the
    partition at each position of the mesh (row-major); device_ids None:
    positions and partitions in the same order."""
    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        return int(np.prod([s for _, s in self.axes], dtype=np.int64))


@dataclasses.dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"tensor<{dims + 'x' if dims else ''}{TYPE_NAMES.get(self.dtype, self.dtype)}>"


@dataclasses.dataclass(frozen=True)
class TokenType:
    """StableHLO's !stablehlo.token: orders side effects, holds no data."""

    def __str__(self) -> str:
        return "!stablehlo.token"


Type = TensorType | TokenType
_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class Value:
    type: Type
    id: int = dataclasses.field(default_factory=lambda: next(_ids))

    def __repr__(self) -> str:
        return f"%{self.id}:{self.type}"


@dataclasses.dataclass(eq=False)
class Block:
    args: list[Value]
    ops: list[Op]
    results: list[Value]  # the operands of the block's return terminator


@dataclasses.dataclass(eq=False)
class Op:
    name: str                      # e.g. "add", "dot_general", "reduce"
    operands: list[Value]
    results: list[Value]
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    regions: list[Block] = dataclasses.field(default_factory=list)
    loc: str = "unknown location"  # user source "file.py:12:4 (fn)" when known

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(repr, self.operands))}) at {self.loc}"


def rewrite(ops: list[Op], rule) -> list[Op]:
    """The ops with each one that rule(op) rewrites replaced by the list of
    ops it returns (None keeps the op), in nested regions too, each op's
    regions before the op itself."""
    out = []
    for op in ops:
        for region in op.regions:
            region.ops[:] = rewrite(region.ops, rule)
        new = rule(op)
        out.extend([op] if new is None else new)
    return out


@dataclasses.dataclass(eq=False)
class Function:
    name: str
    body: Block
    # Per argument: index of the output it may alias (JAX's
    # tf.aliasing_output for donated arguments), or None.
    arg_aliases: list[int | None]
    # Per argument: JAX's jax.buffer_donor (donated, output not yet chosen).
    arg_donors: list[bool] = dataclasses.field(default_factory=list)
    # Per argument / result: sharding annotation text, when present.
    arg_shardings: list[str | None] = dataclasses.field(default_factory=list)
    result_shardings: list[str | None] = dataclasses.field(default_factory=list)
    # Per argument / result: JAX's memory kind (mhlo.memory_kind), when given.
    arg_memory_kinds: list[str | None] = dataclasses.field(default_factory=list)
    result_memory_kinds: list[str | None] = dataclasses.field(default_factory=list)
    # Per argument / result: JAX's device-local layout (mhlo.layout_mode:
    # "default", "auto", or an XLA layout "{minor,...,major}"), when given.
    arg_layout_modes: list[str | None] = dataclasses.field(default_factory=list)
    result_layout_modes: list[str | None] = dataclasses.field(default_factory=list)

    @property
    def arg_types(self) -> list[Type]:
        return [a.type for a in self.body.args]

    @property
    def result_types(self) -> list[Type]:
        return [r.type for r in self.body.results]


@dataclasses.dataclass(eq=False)
class Module:
    functions: dict[str, Function]
    num_replicas: int = 1
    num_partitions: int = 1
    entry: str = "main"
    name: str = "main"                 # the module's sym_name, e.g. jit_f
    # Shardy meshes by name.
    meshes: dict[str, Mesh] = dataclasses.field(default_factory=dict)

    @property
    def main(self) -> Function:
        return self.functions[self.entry]
