"""The walk that makes each IPU's program: local values, their shardings,
and the collectives that move a value from one sharding to another."""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.passes.fuse import reads_of
from jax_ipu.compiler.passes.spmd.combine import combine_all_reduces
from jax_ipu.compiler.passes.spmd.local import made_locally
from jax_ipu.compiler.passes.spmd.rules import partition_op
from jax_ipu.compiler.passes.spmd.sharding import Sharding, Spec, layout_of, parse, replicated
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.ops import ELEMENTWISE_OPS

I32 = ir.TensorType((), np.dtype(np.int32))
U32 = ir.TensorType((), np.dtype(np.uint32))


@dataclasses.dataclass
class Scope:
    """The ops being emitted into one block, and what was made there once
    for reuse (slices, coordinates, reshardings): reusable in the block and
    the blocks nested in it, never outside it."""
    ops: list
    made: dict = dataclasses.field(default_factory=dict)


class Partitioner:
    def __init__(self, module: ir.Module, inspect_sharding=None):
        self.module = module
        self.inspect_sharding = inspect_sharding
        self.functions = dict(module.functions)
        self.meshes = dict(module.meshes)
        self.mesh = self._default_mesh()
        self.env: dict[ir.Value, ir.Value] = {}          # global value -> this IPU's value
        self.sharding: dict[ir.Value, Sharding] = {}     # of local values; absent: replicated
        self.producer: dict[ir.Value, ir.Op] = {}        # whole (replicated) local values: the op making them
        self.defining: dict[ir.Value, ir.Op] = {}        # global values: the op making them
        self.scopes: list[Scope] = [Scope([])]
        self.manual: frozenset[str] = frozenset()        # axes manual here (inside shard_map)
        self.sharding_groups: dict[int, list] = {}       # shard_alike's groups: their (global) values
        self.placed: dict[ir.Value, tuple] = {}          # local results of moves between memories: (operand, move)
        self.loc = "unknown location"

    def _default_mesh(self) -> ir.Mesh:
        n = self.module.num_partitions
        where = f"program {self.module.name}"
        for name, mesh in self.meshes.items():
            if mesh.size not in (1, n):
                raise IpuUnimplementedError(f"{where}: mesh @{name} has {mesh.size} devices but the program "
                                            f"runs on {n}; use one mesh over all devices of the computation")
            if mesh.size > 1 and mesh.device_ids is not None and sorted(mesh.device_ids) != list(range(mesh.size)):
                raise IpuUnimplementedError(f"{where}: mesh @{name} names devices {mesh.device_ids}")
        full = [m for m in self.meshes.values() if m.size == n]
        return full[0] if full else ir.Mesh((("_all", n),))

    # -- emitting --
    @property
    def ops(self) -> list:
        return self.scopes[-1].ops

    def emit(self, name: str, operands: list, result_type, regions=(), **attrs) -> ir.Value:
        result = ir.Value(result_type)
        self.ops.append(ir.Op(name, list(operands), [result], attrs, list(regions), self.loc))
        return result

    def constant(self, value, dtype) -> ir.Value:
        return self.emit("constant", [], ir.TensorType((), np.dtype(dtype)), value=np.asarray(value, dtype))

    def broadcast(self, value: ir.Value, shape, dims=()) -> ir.Value:
        return self.emit("broadcast_in_dim", [value], ir.TensorType(tuple(shape), value.type.dtype),
                         broadcast_dimensions=tuple(dims))

    def once(self, key, make):
        """make(), or what it made for the same key in this block or one
        enclosing it."""
        for scope in reversed(self.scopes):
            if key in scope.made:
                return scope.made[key]
        made = self.scopes[-1].made[key] = make()
        return made

    def push(self) -> None:
        self.scopes.append(Scope([]))

    def pop(self) -> list:
        return self.scopes.pop().ops

    # -- shardings of local values --
    def sharding_of(self, value: ir.Value) -> Sharding:
        s = self.sharding.get(value)
        return s if s is not None else replicated(self.mesh, len(getattr(value.type, "shape", ())))

    def set(self, value: ir.Value, sharding: Sharding) -> ir.Value:
        self.sharding[value] = sharding
        return value

    def local_type(self, t, s: Sharding, where: str):
        if not isinstance(t, ir.TensorType):
            return t
        return ir.TensorType(s.local_shape(t.shape, where), t.dtype)

    def spec_list(self, text, where: str) -> list[Spec]:
        return parse(str(text), self.meshes, where)

    def spec(self, text, where: str) -> Spec:
        found = parse(str(text), self.meshes, where)
        if len(found) != 1:
            raise IpuUnimplementedError(f"{where}: cannot read its sharding {text}")
        return found[0]

    # -- where this IPU is --
    def ids(self, mesh: ir.Mesh) -> np.ndarray:
        """The partition at each mesh position, shaped as the mesh."""
        shape = [s for _, s in mesh.axes]
        ids = np.arange(mesh.size) if mesh.device_ids is None else np.asarray(mesh.device_ids)
        return ids.reshape(shape)

    def groups(self, mesh: ir.Mesh, axes: tuple[str, ...]) -> np.ndarray:
        """Partition ids grouped by equal coordinates off `axes`, each group
        ordered by the coordinate along `axes` (major first)."""
        names = [a for a, _ in mesh.axes]
        moved = np.moveaxis(self.ids(mesh), [names.index(a) for a in axes],
                            range(len(names) - len(axes), len(names)))
        sizes = dict(mesh.axes)
        return moved.reshape(-1, int(np.prod([sizes[a] for a in axes], dtype=np.int64)))

    def coordinate(self, mesh: ir.Mesh, axes: tuple[str, ...]) -> ir.Value:
        """This IPU's index along `axes` (major first), int32."""
        return self.once(("coordinate", mesh, tuple(axes)), lambda: self._coordinate(mesh, tuple(axes)))

    def _coordinate(self, mesh: ir.Mesh, axes: tuple[str, ...]) -> ir.Value:
        p = self.emit("partition_id", [], U32)
        sizes = dict(mesh.axes)
        if mesh.device_ids is not None:
            # The index of each partition, looked up in a table.
            table = np.empty(mesh.size, np.int32)
            index = np.zeros(self.ids(mesh).shape, np.int64)
            for a in axes:
                index = index * sizes[a] + np.indices(index.shape)[[n for n, _ in mesh.axes].index(a)]
            table[self.ids(mesh).ravel()] = index.ravel()
            t = ir.TensorType((mesh.size,), np.dtype(np.int32))
            start = self.emit("convert", [p], I32)
            one = self.emit("dynamic_slice", [self.emit("constant", [], t, value=table), start],
                            ir.TensorType((1,), np.dtype(np.int32)), slice_sizes=(1,))
            return self.emit("reshape", [one], I32)
        names = [a for a, _ in mesh.axes]
        index = self.constant(0, np.uint32)
        for axis in axes:
            stride = int(np.prod([sizes[a] for a in names[names.index(axis) + 1:]], dtype=np.int64))
            c = self.emit("divide", [p, self.constant(stride, np.uint32)], U32)
            c = self.emit("remainder", [c, self.constant(sizes[axis], np.uint32)], U32)
            index = self.emit("multiply", [index, self.constant(sizes[axis], np.uint32)], U32)
            index = self.emit("add", [index, c], U32)
        return self.emit("convert", [index], I32)

    # -- collectives --
    def _collective(self, name: str, value: ir.Value, result_type, groups, body=None, **attrs) -> ir.Value:
        if np.shape(groups)[-1] == 1 and result_type == value.type:
            return value        # over mesh axes of size 1: each IPU keeps what it has
        result = ir.Value(result_type)
        regions = [body] if body is not None else []
        op = ir.Op(name, [value], [result], {"replica_groups": groups, "use_global_device_ids": True, **attrs},
                   regions, self.loc)
        self.ops.append(op)
        if name == "all_reduce":
            self.producer[result] = op      # a slice of the sum is a reduce_scatter (local.py)
        return result

    def _sum_body(self, dtype, which: str) -> ir.Block:
        scalar = ir.TensorType((), dtype)
        a, b, r = ir.Value(scalar), ir.Value(scalar), ir.Value(scalar)
        return ir.Block([a, b], [ir.Op(which, [a, b], [r], {}, [], self.loc)], [r])

    def all_reduce(self, value: ir.Value, mesh: ir.Mesh, axes: tuple[str, ...], which: str) -> ir.Value:
        if which == "add" and value.type.dtype == np.bool_:
            which = "or"
        return self._collective("all_reduce", value, value.type, self.groups(mesh, axes),
                                self._sum_body(value.type.dtype, which))

    def reduce_scatter(self, value: ir.Value, mesh: ir.Mesh, axes: tuple[str, ...], dim: int) -> ir.Value:
        t = value.type
        n = int(np.prod([dict(mesh.axes)[a] for a in axes], dtype=np.int64))
        shape = list(t.shape)
        shape[dim] //= n
        which = "or" if t.dtype == np.bool_ else "add"
        return self._collective("reduce_scatter", value, ir.TensorType(tuple(shape), t.dtype),
                                self.groups(mesh, axes), self._sum_body(t.dtype, which), scatter_dimension=dim)

    def all_gather(self, value: ir.Value, mesh: ir.Mesh, dim: int, axes: tuple[str, ...]) -> ir.Value:
        t = value.type
        n = int(np.prod([dict(mesh.axes)[a] for a in axes], dtype=np.int64))
        shape = list(t.shape)
        shape[dim] *= n
        return self._collective("all_gather", value, ir.TensorType(tuple(shape), t.dtype),
                                self.groups(mesh, axes), all_gather_dim=dim)

    def all_to_all(self, value: ir.Value, mesh: ir.Mesh, axes: tuple[str, ...], split: int, concat: int):
        t = value.type
        n = int(np.prod([dict(mesh.axes)[a] for a in axes], dtype=np.int64))
        shape = list(t.shape)
        shape[split] //= n
        shape[concat] *= n
        return self._collective("all_to_all", value, ir.TensorType(tuple(shape), t.dtype), self.groups(mesh, axes),
                                split_dimension=split, concat_dimension=concat, split_count=n)

    # -- resharding --
    def reshard(self, value: ir.Value, want: Sharding) -> ir.Value:
        """`value` (this IPU's part of a value sharded as it is) made into
        its part of the same value sharded as `want`."""
        have = self.sharding_of(value)
        if have == want or (have.replicated and want.replicated) or not isinstance(value.type, ir.TensorType):
            return value
        if len(want.dims) != len(value.type.shape):
            raise IpuUnimplementedError(f"at {self.loc}: sharding {want.describe()} does not match the rank of "
                                        f"{value.type}")
        def make():
            made = self._reshard(value, have, want)
            return made if made is value else self.set(made, want)
        return self.once(("reshard", value, want), make)

    def _reshard(self, value: ir.Value, have: Sharding, want: Sharding) -> ir.Value:
        placed = self.placed.get(value)
        if placed is not None:
            # A value just moved to another memory is resharded before the
            # move, on the tiles: streaming memory moves data, it computes
            # nothing (no sum, slice or exchange of its own).
            operand, move = placed
            return self.place(self.reshard(operand, want), want, move)
        if have.mesh != want.mesh:
            if self.manual:
                raise IpuUnimplementedError(f"at {self.loc}: a value moves between meshes inside a shard_map")
            value = self.reshard(value, replicated(have.mesh, len(have.dims)))
            return self._reshard(value, replicated(want.mesh, len(want.dims)), want)   # the same values
        mesh = have.mesh
        dims = list(have.dims)
        summed = tuple(a for a, _ in mesh.axes if a in have.unreduced - want.unreduced)
        if summed:
            value = self._reduce(value, mesh, dims, want.dims, summed)
        extra = {a for a in want.unreduced - have.unreduced}
        # A dimension split last by axes becoming partial sums: each IPU's
        # block in its place among zeros (as JAX makes a split value
        # unreduced), no data moved.
        for d, h in enumerate(dims):
            k = len(h)
            while k and h[k - 1] in extra:
                k -= 1
            if k < len(h) and want.dims[d][:k] == h[:k]:
                value = self._spread(value, mesh, d, h[k:])
                extra -= set(h[k:])
                dims[d] = h[:k]
        # Every dimension whose axes are not a prefix of the wanted ones is
        # gathered whole first, then each is sliced to what it lacks: an
        # axis moving between dimensions must leave one before it arrives.
        for d, (h, w) in enumerate(zip(dims, want.dims, strict=False)):
            if h and w[:len(h)] != h:
                value = self.all_gather(value, mesh, d, h)
                dims[d] = ()
        if extra:
            value = self._make_partial(value, mesh, tuple(a for a, _ in mesh.axes if a in extra))
        for d, (h, w) in enumerate(zip(dims, want.dims, strict=False)):
            if len(w) > len(h):
                value = self.slice_dim(value, d, mesh, w[len(h):])
        return value

    def _spread(self, value: ir.Value, mesh: ir.Mesh, dim: int, axes: tuple[str, ...]) -> ir.Value:
        """This IPU's block along `dim` placed at its index along `axes` in
        zeros as long as the blocks of all of them."""
        t = value.type
        n = int(np.prod([dict(mesh.axes)[a] for a in axes], dtype=np.int64))
        shape = list(t.shape)
        shape[dim] *= n
        zeros = self.broadcast(self.constant(0, t.dtype), shape)
        start = self.emit("multiply", [self.coordinate(mesh, axes), self.constant(t.shape[dim], np.int32)], I32)
        zero = self.constant(0, np.int32)
        return self.emit("dynamic_update_slice", [zeros, value, *[start if d == dim else zero for d in range(len(shape))]],
                         ir.TensorType(tuple(shape), t.dtype))

    def _reduce(self, value, mesh, dims: list, want_dims, summed) -> ir.Value:
        """The partial sums over `summed` added up: a reduce_scatter where
        the wanted sharding splits one dimension further by exactly these
        axes (`dims` then updated), else an all_reduce."""
        for d, (h, w) in enumerate(zip(dims, want_dims, strict=False)):
            more = w[len(h):]
            if w[:len(h)] == h and more and set(more) == set(summed):
                dims[d] = w
                return self.reduce_scatter(value, mesh, more, d)
        return self.all_reduce(value, mesh, summed, "add")

    def _make_partial(self, value, mesh, axes):
        """A whole value as partial sums over `axes`: the IPU at coordinate 0
        along them keeps it, the others hold zeros."""
        t = value.type
        first = self.emit("compare", [self.coordinate(mesh, axes), self.constant(0, np.int32)],
                          ir.TensorType((), np.dtype(np.bool_)), comparison_direction="EQ", compare_type="SIGNED")
        zero = self.broadcast(self.constant(0, t.dtype), t.shape)
        return self.emit("select", [self.broadcast(first, t.shape), value, zero], t)

    def place(self, operand: ir.Value, sharding: Sharding, move: ir.Op) -> ir.Value:
        """`move` (an annotate_device_placement) of the local `operand`,
        sharded as it is."""
        result = ir.Value(operand.type)
        self.ops.append(ir.Op(move.name, [operand], [result], move.attrs, [], move.loc))
        self.placed[result] = (operand, move)
        return self.set(result, sharding)

    def reduced(self, value: ir.Value) -> ir.Value:
        s = self.sharding_of(value)
        return self.reshard(value, s.reduced()) if s.unreduced else value

    def whole(self, value: ir.Value) -> ir.Value:
        """The value whole on every IPU."""
        s = self.sharding_of(value)
        return self.reshard(value, replicated(s.mesh, len(s.dims))) if not s.replicated else value

    def slice_dim(self, value: ir.Value, dim: int, mesh: ir.Mesh, axes: tuple[str, ...]) -> ir.Value:
        """This IPU's block of `value` along `dim` split further over `axes`."""
        t = value.type
        n = int(np.prod([dict(mesh.axes)[a] for a in axes], dtype=np.int64))
        shape = list(t.shape)
        if shape[dim] % n:
            raise IpuUnimplementedError(f"at {self.loc}: dimension {dim} of {t} does not split evenly over {n} "
                                        f"IPUs (mesh axes {', '.join(axes)}); jax-ipu runs evenly split arrays only")
        shape[dim] //= n

        def make():
            start = self.emit("multiply", [self.coordinate(mesh, axes), self.constant(shape[dim], np.int32)], I32)
            made = made_locally(self, value, dim, mesh, axes, start, tuple(shape))
            if made is not None:
                # Made by one op from its operands: slices of it may be made so too.
                maker = next((op for op in reversed(self.ops) if made in op.results), None)
                if maker is not None:
                    self.producer[made] = maker
                return made
            zero = self.constant(0, np.int32)
            starts = [start if d == dim else zero for d in range(len(shape))]
            return self.emit("dynamic_slice", [value, *starts], ir.TensorType(tuple(shape), t.dtype),
                             slice_sizes=tuple(shape))
        return self.once(("slice", value, dim, mesh, tuple(axes)), make)

    # -- walking the program --
    def walk(self, block: ir.Block) -> None:
        for op in block.ops:
            self.loc = op.loc
            for r in op.results:
                self.defining[r] = op
            partition_op(self, op)

    def region(self, block: ir.Block, arg_shardings: list, want: list | None = None):
        """A nested block (a loop's body, a branch) partitioned: (the local
        block, the shardings of its results)."""
        where = f"a region at {self.loc}"
        args = [ir.Value(self.local_type(a.type, s, where)) for a, s in zip(block.args, arg_shardings, strict=False)]
        for global_arg, local, s in zip(block.args, args, arg_shardings, strict=False):
            self.env[global_arg] = local
            self.set(local, s)
        self.push()
        self.walk(block)
        results = [self.env[v] for v in block.results]
        if want is not None:
            results = [self.reshard(r, w) for r, w in zip(results, want, strict=False)]
        shardings = [self.sharding_of(r) for r in results]
        return ir.Block(args, self.pop(), results), shardings

    def run(self) -> tuple[ir.Module, tuple]:
        main = self.module.main
        where = f"program {self.module.name}"
        arg_shardings = []
        for i, arg in enumerate(main.body.args):
            text = main.arg_shardings[i] if i < len(main.arg_shardings) else None
            rank = len(getattr(arg.type, "shape", ()))
            s = self.spec(text, f"argument {i} of {where}").resolve(None, self.manual) if text else None
            if s is None or len(s.dims) != rank:
                if s is not None:
                    raise IpuUnimplementedError(f"argument {i} of {where}: sharding {text} does not match its "
                                                f"rank {rank}")
                s = replicated(self.mesh, rank)
            local = ir.Value(self.local_type(arg.type, s, f"argument {i} of {where}"))
            self.env[arg] = local
            self.set(local, s)
            arg_shardings.append(s)
        args = [self.env[a] for a in main.body.args]
        self.walk(main.body)
        results, result_shardings = [], []
        for i, value in enumerate(main.body.results):
            local = self.env[value]
            have = self.sharding_of(local)
            text = main.result_shardings[i] if i < len(main.result_shardings) else None
            if not isinstance(value.type, ir.TensorType):       # a token: nothing to split
                want = have
            elif text:
                want = self.spec(text, f"result {i} of {where}").resolve(have, self.manual)
                if len(want.dims) != len(value.type.shape):
                    raise IpuUnimplementedError(f"result {i} of {where}: sharding {text} does not match its rank")
            else:
                want = have.reduced()
            results.append(self.reshard(local, want))
            result_shardings.append(want)
        body = ir.Block(args, combine_all_reduces(live(self.pop(), results)), results)
        self.functions[main.name] = dataclasses.replace(main, body=body, arg_shardings=[], result_shardings=[])
        layout = (tuple(layout_of(s) for s in arg_shardings), tuple(layout_of(s) for s in result_shardings))
        return dataclasses.replace(self.module, functions=self.functions), layout


# Ops dropped when nothing reads their results: every IPU runs the same
# program, so every IPU drops the same collectives.
_PURE = {"constant", "iota", "broadcast_in_dim", "reshape", "transpose", "slice", "dynamic_slice", "concatenate",
         "gather", "scatter", "dot_general", "reduce", "partition_id", "all_reduce", "all_gather", "reduce_scatter",
         "all_to_all", "pad", "reverse", "select", "sharding_constraint"}


def _moves_data(op: ir.Op) -> bool:
    """A move between memories (its result unread when the value was
    resharded before it and moved again)."""
    return op.name == "custom_call" and op.attrs.get("call_target_name") == "annotate_device_placement"


def live(ops: list[ir.Op], results: list[ir.Value]) -> list[ir.Op]:
    read = set(results)
    kept = []
    for op in reversed(ops):
        if (op.name in _PURE or op.name in ELEMENTWISE_OPS or _moves_data(op)) and not any(r in read for r in op.results):
            continue
        kept.append(op)
        read.update(reads_of(op))
    return kept[::-1]
