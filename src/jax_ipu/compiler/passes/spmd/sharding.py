"""How a value is split over the IPUs of a mesh, and Shardy's annotations
of it read from their printed form.

A Sharding names, per dimension, the mesh axes splitting it (major first:
dimension 0 split over ("x", "y") is in |x| * |y| blocks, block
x * |y| + y on the IPU at mesh coordinates (x, y)) and the axes over which
the IPUs hold partial sums still to be added up (Shardy's and JAX's
`unreduced`). Every other axis holds copies. Inside a shard_map the
manual axes appear in no Sharding: there each IPU's value is its own."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from jax_ipu import ir
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.stablehlo.attributes import mesh as parse_mesh

Dims = tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True)
class Sharding:
    mesh: ir.Mesh
    dims: Dims
    unreduced: frozenset[str] = frozenset()

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.mesh.axes)

    def splits(self, dim: int) -> int:
        return int(np.prod([self.sizes[a] for a in self.dims[dim]], dtype=np.int64))

    @property
    def replicated(self) -> bool:
        """Every IPU holds the whole value."""
        return not any(self.dims) and not self.unreduced

    @property
    def axes(self) -> set[str]:
        return {a for axes in self.dims for a in axes}

    def with_dims(self, dims) -> Sharding:
        return Sharding(self.mesh, tuple(tuple(d) for d in dims), self.unreduced)

    def reduced(self) -> Sharding:
        return Sharding(self.mesh, self.dims)

    def local_shape(self, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
        out = []
        for d, size in enumerate(shape):
            n = self.splits(d)
            if size % n:
                raise IpuUnimplementedError(
                    f"{where}: dimension {d} of size {size} does not split evenly over {n} IPUs (mesh axes "
                    f"{', '.join(self.dims[d])}); jax-ipu runs evenly split arrays only: pad the dimension "
                    f"to a multiple of {n} or split another one")
            out.append(size // n)
        return tuple(out)

    def describe(self) -> str:
        text = "[" + ", ".join("{" + ", ".join(a) + "}" for a in self.dims) + "]"
        return text + (f" unreduced={{{', '.join(sorted(self.unreduced))}}}" if self.unreduced else "")


def replicated(mesh: ir.Mesh, rank: int) -> Sharding:
    return Sharding(mesh, ((),) * rank)


def layout_of(s: Sharding) -> tuple:
    """A sharding as plain values (for the executable and its serialized form):
    (mesh axes, mesh device ids or None, per dimension its axes, unreduced axes)."""
    return (s.mesh.axes, s.mesh.device_ids, s.dims, tuple(a for a, _ in s.mesh.axes if a in s.unreduced))



@dataclasses.dataclass(frozen=True)
class Spec:
    """A sharding as annotated: a dimension marked open (`{"x", ?}`, `{?}`)
    may be split further than it says, as the partitioner chooses."""
    mesh: ir.Mesh
    dims: Dims
    open: tuple[bool, ...]
    unreduced: frozenset[str]

    def resolve(self, have: Sharding | None, manual: frozenset[str], fixed: frozenset[str] = frozenset()) -> Sharding:
        """The sharding to make of a value sharded as `have` (None: not yet
        known), leaving out the axes `manual` here (inside a shard_map):
        open dimensions keep what `have` adds after their closed axes,
        unless it adds one of the axes `fixed` (a shard_map's manual axes,
        which split a value exactly as its specs say)."""
        if self.mesh.size == 1 and have is not None and len(have.dims) == len(self.dims):
            return have         # a mesh of one device (Shardy's empty_mesh) constrains nothing
        dims = [tuple(a for a in axes if a not in manual) for axes in self.dims]
        if have is not None and have.mesh == self.mesh:
            named = {a for axes in dims for a in axes} | self.unreduced | fixed
            for d, axes in enumerate(dims):
                kept = have.dims[d] if d < len(have.dims) else ()
                if self.open[d] and kept[:len(axes)] == axes and not (set(kept[len(axes):]) & named):
                    named |= set(kept)
                    dims[d] = kept
        return Sharding(self.mesh, tuple(dims), frozenset(a for a in self.unreduced if a not in manual))


_MESH_REF = r"(@[\w.$-]+|mesh<[^>]*>)"
_ONE = re.compile(r"<\s*" + _MESH_REF + r"\s*,\s*\[([^\[\]]*)\]([^<>]*)>")
_DIM = re.compile(r"\{([^}]*)\}")
_AXIS = re.compile(r'"([^"]+)"(:\(\d+\)\d+)?')


def parse(text: str, meshes: dict[str, ir.Mesh], where: str) -> list[Spec]:
    """Every `<@mesh, [{...}, ...], unreduced={...}>` in `text`, in order
    (one for a value's sdy.sharding, one per value of a manual
    computation's in_shardings / out_shardings)."""
    found = []
    for m in _ONE.finditer(text):
        ref, dims_text, rest = m[1], m[2], m[3]
        if ref.startswith("@"):
            mesh = meshes.get(ref[1:])
            if mesh is None:
                raise IpuUnimplementedError(f"{where}: sharding over unknown mesh {ref}")
        else:
            mesh = parse_mesh(ref[len("mesh"):])
        dims, open_ = [], []
        for group in _DIM.findall(dims_text):
            axes = _AXIS.findall(group)
            if any(sub for _, sub in axes):
                raise IpuUnimplementedError(f"{where}: sub-axis shardings ({group.strip()}) are not supported; "
                                            "split dimensions over whole mesh axes")
            dims.append(tuple(a for a, _ in axes))
            open_.append("?" in group)
        unreduced = re.search(r"unreduced\s*=\s*\{([^}]*)\}", rest)
        names = {a for a, _ in mesh.axes}
        spec = Spec(mesh, tuple(dims), tuple(open_),
                    frozenset(_AXIS_NAME.findall(unreduced[1])) if unreduced else frozenset())
        unknown = ({a for axes in spec.dims for a in axes} | spec.unreduced) - names
        if unknown:
            raise IpuUnimplementedError(f"{where}: sharding names axes {sorted(unknown)} its mesh does not have")
        found.append(spec)
    return found


_AXIS_NAME = re.compile(r'"([^"]+)"')
