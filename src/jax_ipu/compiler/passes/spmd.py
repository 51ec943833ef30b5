"""SPMD partitioning: a program over P partitions (jax.shard_map, pmap, jit
of sharded arrays) -> the program each IPU runs on its shard.

JAX sends the global program with Shardy annotations: a sharding per
argument and result (`#sdy.sharding<@mesh, [{"i"}, {}]>`: dimension 0
split over mesh axis "i") and `sdy.manual_computation` regions whose body
already works on one shard and names its collectives. Each IPU's program
takes its shard of every argument, runs manual bodies as they are, and
splits the global ops around them by the rules below (element-wise ops
keep their operands' sharding, a sharded contraction or reduction adds an
all_reduce, results are gathered or sliced to the sharding JAX asks for).
A pattern with no rule fails at compile time, naming it."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.lowering.reduce import single_op
from jax_ipu.compiler.passes.fuse import reads_of
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.ops import ELEMENTWISE_OPS

Dims = tuple[tuple[str, ...], ...]      # per dimension: the mesh axes splitting it, major first


@dataclasses.dataclass(frozen=True)
class Sharding:
    mesh: tuple[tuple[str, int], ...]
    dims: Dims

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.mesh)

    def splits(self, dim: int) -> int:
        return int(np.prod([self.sizes[a] for a in self.dims[dim]], dtype=np.int64))

    @property
    def replicated(self) -> bool:
        return not any(self.dims)

    def local_shape(self, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
        out = []
        for d, size in enumerate(shape):
            n = self.splits(d)
            if size % n:
                raise IpuUnimplementedError(f"{where}: dimension {d} of size {size} does not split evenly "
                                            f"over {n} IPUs (mesh axes {', '.join(self.dims[d])})")
            out.append(size // n)
        return tuple(out)

    def describe(self) -> str:
        return "[" + ", ".join("{" + ", ".join(a) + "}" for a in self.dims) + "]"


_ONE = re.compile(r"<\s*(@[\w.$-]+|mesh<[^>]*>)\s*,\s*\[([^\[\]]*)\]")


def parse_shardings(text: str, meshes: dict, where: str) -> list[Sharding]:
    """Every `<@mesh, [{...}, ...]>` in `text`, in order."""
    found = []
    for m in _ONE.finditer(text):
        name, dims_text = m[1], m[2]
        if name.startswith("@"):
            mesh = meshes.get(name[1:])
            if mesh is None:
                raise IpuUnimplementedError(f"{where}: sharding over unknown mesh {name}")
        else:
            mesh = tuple((a, int(s)) for a, s in re.findall(r'"([^"]+)"\s*=\s*(\d+)', name))
        dims = []
        for axes in re.findall(r"\{([^}]*)\}", dims_text):
            if ":(" in axes:
                raise IpuUnimplementedError(f"{where}: sub-axis shardings ({axes}) are not supported")
            dims.append(tuple(re.findall(r'"([^"]+)"', axes)))
        found.append(Sharding(mesh, tuple(dims)))
    return found


def _replicated(mesh, rank: int) -> Sharding:
    return Sharding(mesh, ((),) * rank)


def _mesh_of(module: ir.Module, where: str) -> tuple[tuple[str, int], ...]:
    meshes = [m for m in module.meshes.values() if int(np.prod([s for _, s in m])) > 1]
    if len(meshes) > 1:
        raise IpuUnimplementedError(f"{where}: programs over several meshes are not supported")
    if meshes:
        return meshes[0]
    return (("_all", module.num_partitions),)


class _Partitioner:
    def __init__(self, module: ir.Module):
        self.module = module
        self.mesh = _mesh_of(module, f"program {module.name}")
        self.sizes = dict(self.mesh)
        if int(np.prod(list(self.sizes.values()))) != module.num_partitions:
            raise IpuUnimplementedError(f"program {module.name}: its mesh {self.mesh} does not cover its "
                                        f"{module.num_partitions} partitions")
        self.env: dict[ir.Value, ir.Value] = {}
        self.sharding: dict[ir.Value, Sharding] = {}   # of local values; absent: replicated
        self.ops: list[ir.Op] = []
        self.functions: dict[str, ir.Function] = dict(module.functions)
        self.producer: dict[ir.Value, ir.Op] = {}     # whole (replicated) local values: the op making them
        self.slices: dict[tuple, ir.Value] = {}       # (whole value, dim, axes): its slice, made once
        self.loc = "unknown location"

    # -- emitting local ops --
    def emit(self, name: str, operands: list, result_type: ir.TensorType, **attrs) -> ir.Value:
        result = ir.Value(result_type)
        self.ops.append(ir.Op(name, list(operands), [result], attrs, [], self.loc))
        return result

    def constant(self, value, dtype) -> ir.Value:
        return self.emit("constant", [], ir.TensorType((), np.dtype(dtype)), value=np.asarray(value, dtype))

    def coordinate(self, axes: tuple[str, ...]) -> ir.Value:
        """This IPU's index along the given mesh axes (major first), int32."""
        p = self.emit("partition_id", [], ir.TensorType((), np.dtype(np.uint32)))
        names = [a for a, _ in self.mesh]
        u32 = ir.TensorType((), np.dtype(np.uint32))
        index = self.constant(0, np.uint32)
        for axis in axes:
            stride = int(np.prod([self.sizes[a] for a in names[names.index(axis) + 1:]], dtype=np.int64))
            c = self.emit("divide", [p, self.constant(stride, np.uint32)], u32)
            c = self.emit("remainder", [c, self.constant(self.sizes[axis], np.uint32)], u32)
            index = self.emit("multiply", [index, self.constant(self.sizes[axis], np.uint32)], u32)
            index = self.emit("add", [index, c], u32)
        return self.emit("convert", [index], ir.TensorType((), np.dtype(np.int32)))

    def groups(self, axes: tuple[str, ...]) -> np.ndarray:
        """Partition ids grouped by equal coordinates off `axes`."""
        names = [a for a, _ in self.mesh]
        ids = np.arange(self.module.num_partitions).reshape([s for _, s in self.mesh])
        moved = np.moveaxis(ids, [names.index(a) for a in axes], range(len(names) - len(axes), len(names)))
        return moved.reshape(-1, int(np.prod([self.sizes[a] for a in axes], dtype=np.int64)))

    # -- resharding a local value --
    def slice_to(self, value: ir.Value, have: Sharding, want: Sharding, global_shape, where: str) -> ir.Value:
        """A value sharded as `have` made into `want` by slicing (from
        replicated dimensions) or gathering (to replicated dimensions)."""
        if have.dims == want.dims:
            return value
        for d, (h, w) in enumerate(zip(have.dims, want.dims, strict=True)):
            if h == w:
                continue
            if h:       # gathered whole (then split anew: moving between mesh axes)
                value = self.gather(value, d, h)
            if w:
                value = self.slice_dim(value, d, w)
        return value

    def gather(self, value: ir.Value, dim: int, axes: tuple[str, ...]) -> ir.Value:
        t = value.type
        n = int(np.prod([self.sizes[a] for a in axes]))
        shape = list(t.shape)
        shape[dim] *= n
        return self.emit("all_gather", [value], ir.TensorType(tuple(shape), t.dtype), all_gather_dim=dim,
                         replica_groups=self.groups(axes), use_global_device_ids=True)

    def slice_dim(self, value: ir.Value, dim: int, axes: tuple[str, ...]) -> ir.Value:
        key = (value, dim, tuple(axes))
        if key not in self.slices:
            self.slices[key] = self._slice_dim(value, dim, axes)
        return self.slices[key]

    def _slice_dim(self, value: ir.Value, dim: int, axes: tuple[str, ...]) -> ir.Value:
        t = value.type
        n = int(np.prod([self.sizes[a] for a in axes]))
        shape = list(t.shape)
        shape[dim] //= n
        start = self.emit("multiply", [self.coordinate(axes), self.constant(shape[dim], np.int32)],
                          ir.TensorType((), np.dtype(np.int32)))
        made = self.made_locally(value, dim, axes, start, tuple(shape))
        if made is not None:
            return made
        zero = self.constant(0, np.int32)
        starts = [start if d == dim else zero for d in range(len(shape))]
        return self.emit("dynamic_slice", [value, *starts], ir.TensorType(tuple(shape), t.dtype),
                         slice_sizes=tuple(shape))

    def made_locally(self, value: ir.Value, dim: int, axes, start: ir.Value, shape: tuple) -> ir.Value | None:
        """This IPU's slice of a whole value computed here from replicated
        inputs, made from the slices of what it is made of (a broadcast,
        an iota, a scatter into zeros: the one-hot masks, the gradients of
        an embedding or a take_along_axis), so that the whole value need
        not exist on any IPU (dead code then). None: slice it."""
        op = self.producer.get(value)
        rule = None if op is None else SLICE_RULES.get(op.name)
        if rule is None and op is not None and op.name in GLOBAL_RULES and GLOBAL_RULES[op.name] is _elementwise:
            rule = _slice_elementwise
        if rule is None:
            return None
        return rule(self, op, dim, axes, start, shape)

    def all_reduce(self, value: ir.Value, axes: tuple[str, ...], op: str) -> ir.Value:
        t = value.type
        scalar = ir.TensorType((), t.dtype)
        a, b = ir.Value(scalar), ir.Value(scalar)
        r = ir.Value(scalar)
        body = ir.Block([a, b], [ir.Op(op, [a, b], [r], {}, [], self.loc)], [r])
        result = ir.Value(t)
        op = ir.Op("all_reduce", [value], [result], {"replica_groups": self.groups(axes), "use_global_device_ids": True},
                   [body], self.loc)
        self.ops.append(op)
        self.producer[result] = op      # a slice of it is a reduce_scatter (_slice_all_reduce)
        return result

    # -- the program --
    def run(self) -> ir.Module:
        main = self.module.main
        where = f"program {self.module.name}"
        shardings = [self._annotation(s, a.type, f"argument {i} of {where}")
                     for i, (s, a) in enumerate(zip(main.arg_shardings or [None] * len(main.body.args),
                                                    main.body.args, strict=True))]
        args = []
        for i, (arg, s) in enumerate(zip(main.body.args, shardings, strict=True)):
            local = ir.Value(ir.TensorType(s.local_shape(arg.type.shape, f"argument {i} of {where}"),
                                           arg.type.dtype)) if isinstance(arg.type, ir.TensorType) else arg
            self.env[arg] = local
            self.sharding[local] = s
            args.append(local)
        for op in main.body.ops:
            self.loc = op.loc
            self.op(op)
        results, wants = [], []
        result_shardings = main.result_shardings or [None] * len(main.body.results)
        for i, (value, text) in enumerate(zip(main.body.results, result_shardings, strict=True)):
            local = self.env[value]
            have = self.sharding_of(local)
            if not isinstance(value.type, ir.TensorType):   # a token (ordered effects): nothing to split
                results.append(local)
                wants.append(have)
                continue
            want = self._annotation(text, value.type, f"result {i} of {where}") if text else have
            results.append(self.slice_to(local, have, want, value.type.shape, f"result {i} of {where}"))
            wants.append(want)
        function = dataclasses.replace(main, body=ir.Block(args, _live(self.ops, results), results),
                                       arg_shardings=[], result_shardings=[])
        self.functions[main.name] = function
        self.layout = (self.mesh, [s.dims for s in shardings],
                       [w.dims for w in wants])
        return dataclasses.replace(self.module, functions=self.functions)

    def _annotation(self, text: str | None, t, where: str) -> Sharding:
        rank = len(getattr(t, "shape", ()))
        if not text:
            return _replicated(self.mesh, rank)
        found = parse_shardings(text, self.module.meshes, where)
        if len(found) != 1:
            raise IpuUnimplementedError(f"{where}: cannot read its sharding {text}")
        s = found[0]
        if len(s.dims) != rank:
            raise IpuUnimplementedError(f"{where}: sharding {text} does not match its rank {rank}")
        return Sharding(self.mesh, s.dims) if s.replicated else s

    def sharding_of(self, value: ir.Value) -> Sharding:
        s = self.sharding.get(value)
        return s if s is not None else _replicated(self.mesh, len(getattr(value.type, "shape", ())))

    def op(self, op: ir.Op) -> None:
        if op.name == "sdy.manual_computation":
            return self.manual(op)
        rule = GLOBAL_RULES.get(op.name)
        operands = [self.env[v] for v in op.operands]
        if op.name == "call":
            return self.inline(op, operands)
        if all(self.sharding_of(v).replicated for v in operands):
            # Every IPU computes the same: the op as it is (its regions
            # reading every IPU's whole copy of what they read outside).
            results = [ir.Value(r.type) for r in op.results]
            local = ir.Op(op.name, operands, results, op.attrs, self.regions_of(op), op.loc)
            self.ops.append(local)
            self.env.update(zip(op.results, results, strict=True))
            if len(results) == 1:
                self.producer[results[0]] = local
            return
        (rule or _gathered)(self, op, operands)

    def inline(self, op: ir.Op, operands: list) -> None:
        """A call of a function (a nested jit: jnp.where, log_softmax, take):
        its body partitioned in place, so that shards flow through it and
        slices of its whole results can be made from their parts."""
        body = self.functions[op.attrs["callee"]].body
        self.env.update(zip(body.args, operands, strict=True))
        for inner in body.ops:
            self.loc = inner.loc
            self.op(inner)
        self.loc = op.loc
        self.env.update((r, self.env[v]) for r, v in zip(op.results, body.results, strict=True))

    def broadcast(self, value: ir.Value, shape, dims) -> ir.Value:
        return self.emit("broadcast_in_dim", [value], ir.TensorType(tuple(shape), value.type.dtype),
                         broadcast_dimensions=tuple(dims))

    def regions_of(self, op: ir.Op) -> list[ir.Block]:
        """op's regions, renamed to read this program's whole (replicated)
        copy of each value they read from outside (a loop's bounds and
        constants, which JAX hoists out of its body)."""
        outer = _outer_reads(op)
        if not outer:
            return op.regions
        renamed = {}
        for v in outer:
            local = self.env[v]
            renamed[v] = self.slice_to(local, self.sharding_of(local),
                                       _replicated(self.mesh, len(getattr(v.type, "shape", ()))), None,
                                       f"a value {op.name} at {op.loc} reads inside")
        return [_renamed(region, renamed) for region in op.regions]

    def manual(self, op: ir.Op) -> None:
        where = f"shard_map at {op.loc}"
        ins = parse_shardings(str(op.attrs.get("in_shardings", "")), self.module.meshes, where)
        outs = parse_shardings(str(op.attrs.get("out_shardings", "")), self.module.meshes, where)
        manual_axes = set(re.findall(r'"([^"]+)"', str(op.attrs.get("manual_axes", ""))))
        auto = [a for a, s in self.mesh if a not in manual_axes and s > 1]
        if auto:
            raise IpuUnimplementedError(f"{where}: shard_map over some mesh axes only (axes {', '.join(auto)} "
                                        "left automatic) is not supported; map over all axes of the mesh")
        body = op.regions[0]
        operands = []
        for i, (value, arg) in enumerate(zip(op.operands, body.args, strict=True)):
            local = self.env[value]
            if not isinstance(value.type, ir.TensorType):    # a token: nothing to split
                operands.append(local)
                continue
            want = Sharding(self.mesh, ins[i].dims) if i < len(ins) else _replicated(self.mesh, len(arg.type.shape))
            local = self.slice_to(local, self.sharding_of(local), want, value.type.shape, f"operand {i} of {where}")
            if local.type != arg.type:
                raise IpuUnimplementedError(f"{where}: operand {i} is {local.type} on each IPU but the body "
                                            f"takes {arg.type}")
            operands.append(local)
        name = f"shard_map.{len(self.functions)}"
        self.functions[name] = ir.Function(name, body, [None] * len(body.args), [False] * len(body.args))
        results = [ir.Value(r.type) for r in body.results]
        self.ops.append(ir.Op("call", operands, results, {"callee": name}, [], op.loc))
        for i, (old, new) in enumerate(zip(op.results, results, strict=True)):
            self.env[old] = new
            if i < len(outs) and isinstance(new.type, ir.TensorType):
                self.sharding[new] = Sharding(self.mesh, outs[i].dims)


# Ops without effects: dropped when nothing reads their results (the whole
# values replaced by slices made locally).
# Ops dropped when nothing reads their results. An all_reduce too: every IPU
# runs the same program, so every IPU drops it (its sum was replaced by a
# reduce_scatter's slices).
_PURE = {"constant", "iota", "broadcast_in_dim", "reshape", "transpose", "slice", "dynamic_slice", "concatenate",
         "gather", "scatter", "dot_general", "reduce", "partition_id", "all_reduce"}


def _live(ops: list[ir.Op], results: list[ir.Value]) -> list[ir.Op]:
    from jax_ipu.compiler.passes.fuse import reads_of
    from jax_ipu.ops import ELEMENTWISE_OPS
    read = set(results)
    kept = []
    for op in reversed(ops):
        if (op.name in _PURE or op.name in ELEMENTWISE_OPS) and not any(r in read for r in op.results):
            continue
        kept.append(op)
        read.update(reads_of(op))
    return kept[::-1]


def _outer_reads(op: ir.Op) -> list[ir.Value]:
    """The values the op's regions read from outside it, once each."""

    def defined(block: ir.Block):
        yield from block.args
        for inner in block.ops:
            yield from inner.results
            for region in inner.regions:
                yield from defined(region)
    inside = {v for region in op.regions for v in defined(region)}
    return list(dict.fromkeys(v for v in reads_of(op, regions_only=True) if v not in inside))


def _renamed(block: ir.Block, renamed: dict) -> ir.Block:
    """A copy of the block reading renamed[v] for each outer value v."""
    ops = [dataclasses.replace(inner, operands=[renamed.get(v, v) for v in inner.operands],
                               regions=[_renamed(r, renamed) for r in inner.regions]) for inner in block.ops]
    return ir.Block(block.args, ops, [renamed.get(v, v) for v in block.results])


# -- global ops over sharded operands: rule(partitioner, op, local operands) --
def _local_type(p: _Partitioner, t: ir.TensorType, s: Sharding, where: str) -> ir.TensorType:
    return ir.TensorType(s.local_shape(t.shape, where), t.dtype)


def _emit_like(p: _Partitioner, op: ir.Op, operands: list, shardings: list[Sharding], attrs=None) -> None:
    """The op on local operands, its results sharded as given."""
    results = [ir.Value(_local_type(p, r.type, s, f"{op.name} at {op.loc}")) for r, s in zip(op.results, shardings, strict=True)]
    p.ops.append(ir.Op(op.name, operands, results, attrs if attrs is not None else op.attrs, op.regions, op.loc))
    for old, new, s in zip(op.results, results, shardings, strict=True):
        p.env[old] = new
        p.sharding[new] = s


def _gathered(p: _Partitioner, op: ir.Op, operands: list) -> None:
    """Any other op: its operands gathered whole on every IPU, the op run
    replicated (correct for every op, at the price of the gathers)."""
    whole = [p.slice_to(v, p.sharding_of(v), _replicated(p.mesh, len(getattr(v.type, "shape", ()))), None,
                        f"operand {i} of {op.name} at {op.loc}") for i, v in enumerate(operands)]
    results = [ir.Value(r.type) for r in op.results]
    p.ops.append(ir.Op(op.name, whole, results, op.attrs, p.regions_of(op), op.loc))
    p.env.update(zip(op.results, results, strict=True))


def _elementwise(p: _Partitioner, op: ir.Op, operands: list) -> None:
    want = next(p.sharding_of(v) for v in operands if not p.sharding_of(v).replicated)
    local = [p.slice_to(v, p.sharding_of(v), want, None, f"operand {i} of {op.name} at {op.loc}")
             for i, v in enumerate(operands)]
    _emit_like(p, op, local, [want] * len(op.results))


def _broadcast_in_dim(p: _Partitioner, op: ir.Op, operands: list) -> None:
    s = p.sharding_of(operands[0])
    out_rank = len(op.results[0].type.shape)
    dims = [()] * out_rank
    for i, d in enumerate(op.attrs["broadcast_dimensions"]):
        dims[d] = s.dims[i]
    _emit_like(p, op, operands, [Sharding(p.mesh, tuple(dims))])


def _transpose(p: _Partitioner, op: ir.Op, operands: list) -> None:
    s = p.sharding_of(operands[0])
    _emit_like(p, op, operands, [Sharding(p.mesh, tuple(s.dims[d] for d in op.attrs["permutation"]))])


def _reshape(p: _Partitioner, op: ir.Op, operands: list) -> None:
    """Sharded dimensions that keep their size and the product of the
    dimensions before them keep their sharding; otherwise gathered."""
    s, shape_in, shape_out = p.sharding_of(operands[0]), op.operands[0].type.shape, op.results[0].type.shape
    before_out = {int(np.prod(shape_out[:d], dtype=np.int64)): d for d in range(len(shape_out))}
    dims = [()] * len(shape_out)
    for d, axes in enumerate(s.dims):
        if not axes:
            continue
        o = before_out.get(int(np.prod(shape_in[:d], dtype=np.int64)))
        if o is None or shape_out[o] != shape_in[d]:
            return _gathered(p, op, operands)
        dims[o] = axes
    _emit_like(p, op, operands, [Sharding(p.mesh, tuple(dims))])


def _dot_general(p: _Partitioner, op: ir.Op, operands: list) -> None:
    """Batch and contracting dimensions sharded alike on both sides (a
    replicated side is sliced to match); free dimensions keep their
    sharding; contracting over a sharded dimension adds an all_reduce."""
    dn = op.attrs["dot_dimension_numbers"]
    where = f"dot_general at {op.loc}"
    lhs, rhs = operands
    ls, rs = p.sharding_of(lhs), p.sharding_of(rhs)
    pairs = list(zip(dn.lhs_batching_dimensions, dn.rhs_batching_dimensions, strict=True)) + \
        list(zip(dn.lhs_contracting_dimensions, dn.rhs_contracting_dimensions, strict=True))
    rdims = list(rs.dims)
    for l, r in pairs:                         # the rhs follows the lhs on shared dimensions
        rdims[r] = ls.dims[l]
    ldims = list(ls.dims)
    for l, r in pairs:
        if not ls.dims[l] and rs.dims[r]:     # ... unless only the rhs is sharded there
            ldims[l] = rdims[r] = rs.dims[r]
    want_l, want_r = Sharding(p.mesh, tuple(ldims)), Sharding(p.mesh, tuple(rdims))
    lhs = p.slice_to(lhs, ls, want_l, None, f"lhs of {where}")
    rhs = p.slice_to(rhs, rs, want_r, None, f"rhs of {where}")
    n_l, n_r = len(ldims), len(rdims)
    lhs_free = [d for d in range(n_l) if d not in dn.lhs_batching_dimensions + dn.lhs_contracting_dimensions]
    rhs_free = [d for d in range(n_r) if d not in dn.rhs_batching_dimensions + dn.rhs_contracting_dimensions]
    out = tuple([ldims[d] for d in dn.lhs_batching_dimensions] + [ldims[d] for d in lhs_free]
                + [rdims[d] for d in rhs_free])
    used = [a for axes in out for a in axes]
    if len(used) != len(set(used)):
        return _gathered(p, op, operands)
    _emit_like(p, op, [lhs, rhs], [Sharding(p.mesh, out)])
    summed = tuple(a for d in dn.lhs_contracting_dimensions for a in ldims[d])
    if summed:
        result = p.env[op.results[0]]
        p.env[op.results[0]] = total = p.all_reduce(result, summed, "add")
        p.sharding[total] = p.sharding[result]


def _reduce(p: _Partitioner, op: ir.Op, operands: list) -> None:
    """Each IPU reduces its shard; reduced sharded dimensions are combined
    by an all_reduce with the body's op."""
    n = len(operands) // 2
    s = p.sharding_of(operands[0])
    if any(p.sharding_of(v).dims != s.dims for v in operands[1:n]) or \
            any(not p.sharding_of(v).replicated for v in operands[n:]):
        return _gathered(p, op, operands)
    reduced = sorted(op.attrs["dimensions"])
    summed = tuple(a for d in reduced for a in s.dims[d])
    which = single_op(op.regions[0]) if n == 1 else None
    if summed and which is None:
        return _gathered(p, op, operands)
    kept = Sharding(p.mesh, tuple(axes for d, axes in enumerate(s.dims) if d not in reduced))
    _emit_like(p, op, operands, [kept] * n)
    if summed:
        result = p.env[op.results[0]]
        p.env[op.results[0]] = total = p.all_reduce(result, summed, which)
        p.sharding[total] = kept


def _gather(p: _Partitioner, op: ir.Op, operands: list) -> None:
    """A table split along the dimension it is indexed by (an embedding
    split by vocabulary, take_along_axis over a vocabulary-split row), the
    indices whole: each IPU gathers the rows it holds, zeros for the others,
    and an all_reduce adds them up (XLA's SPMD partitioner does the same),
    so the table is never gathered whole. Other shardings: gathered."""
    x, indices = operands
    xs, dn = p.sharding_of(x), op.attrs["dimension_numbers"]
    sharded = [d for d, axes in enumerate(xs.dims) if axes]
    slice_sizes = tuple(op.attrs["slice_sizes"])
    if (len(sharded) != 1 or not p.sharding_of(indices).replicated or sharded[0] not in dn.collapsed_slice_dims
            or sharded[0] not in dn.start_index_map or slice_sizes[sharded[0]] != 1):
        return _gathered(p, op, operands)
    d = sharded[0]
    axes, full, local = xs.dims[d], op.operands[0].type.shape[d], x.type.shape[d]
    it = indices.type
    scalar = ir.TensorType((), it.dtype)
    ivd = dn.index_vector_dim
    batch_shape = tuple(s for i, s in enumerate(it.shape) if i != ivd)
    bt = ir.TensorType(batch_shape, it.dtype)
    k = dn.start_index_map.index(d)
    if ivd == len(it.shape):
        column = indices
    else:
        starts, limits = [0] * len(it.shape), list(it.shape)
        starts[ivd], limits[ivd] = k, k + 1
        part = p.emit("slice", [indices], ir.TensorType(tuple(1 if i == ivd else s for i, s in enumerate(it.shape)),
                                                          it.dtype),
                      start_indices=tuple(starts), limit_indices=tuple(limits), strides=(1,) * len(it.shape))
        column = p.emit("reshape", [part], bt)
    # The gather clamps each start into the table; then it is shifted to this IPU's rows.
    lo = p.broadcast(p.constant(0, it.dtype), batch_shape, ())
    hi = p.broadcast(p.constant(full - 1, it.dtype), batch_shape, ())
    clamped = p.emit("clamp", [lo, column, hi], bt)
    first = p.emit("multiply", [p.emit("convert", [p.coordinate(axes)], scalar), p.constant(local, it.dtype)], scalar)
    shifted = p.emit("subtract", [clamped, p.broadcast(first, batch_shape, ())], bt)
    mine = p.emit("and", [p.emit("compare", [shifted, lo], ir.TensorType(batch_shape, np.dtype(np.bool_)),
                                 comparison_direction="GE", compare_type="SIGNED"),
                          p.emit("compare", [shifted, p.broadcast(p.constant(local, it.dtype), batch_shape, ())],
                                 ir.TensorType(batch_shape, np.dtype(np.bool_)),
                                 comparison_direction="LT", compare_type="SIGNED")],
                  ir.TensorType(batch_shape, np.dtype(np.bool_)))
    if ivd == len(it.shape):
        local_indices = shifted
    else:
        shape1 = tuple(1 if i == ivd else s for i, s in enumerate(it.shape))
        pieces = []
        if k:
            pieces.append(p.emit("slice", [indices], ir.TensorType(tuple(k if i == ivd else s for i, s in enumerate(
                it.shape)), it.dtype), start_indices=(0,) * len(it.shape),
                limit_indices=tuple(k if i == ivd else s for i, s in enumerate(it.shape)), strides=(1,) * len(it.shape)))
        pieces.append(p.emit("reshape", [shifted], ir.TensorType(shape1, it.dtype)))
        rest = it.shape[ivd] - k - 1
        if rest:
            pieces.append(p.emit("slice", [indices], ir.TensorType(tuple(rest if i == ivd else s for i, s in enumerate(
                it.shape)), it.dtype), start_indices=tuple(k + 1 if i == ivd else 0 for i in range(len(it.shape))),
                limit_indices=tuple(it.shape), strides=(1,) * len(it.shape)))
        local_indices = pieces[0] if len(pieces) == 1 else p.emit("concatenate", pieces, it, dimension=ivd)
    rt = op.results[0].type
    rows = p.emit("gather", [x, local_indices], rt, **op.attrs)
    batch_dims = [i for i in range(len(rt.shape)) if i not in dn.offset_dims]
    mask = p.broadcast(mine, rt.shape, batch_dims)
    zeros = p.broadcast(p.constant(0, rt.dtype), rt.shape, ())
    kept = p.emit("select", [mask, rows, zeros], rt)
    p.env[op.results[0]] = p.all_reduce(kept, axes, "add")


# -- slices of whole values made locally: rule(partitioner, op, dim, axes, start, local shape) --
def _slice_elementwise(p: _Partitioner, op: ir.Op, dim, axes, start, shape):
    full = op.results[0].type.shape
    operands = [p.slice_dim(v, dim, axes) if v.type.shape == full else v for v in op.operands]
    return p.emit(op.name, operands, ir.TensorType(shape, op.results[0].type.dtype), **op.attrs)


def _slice_broadcast(p: _Partitioner, op: ir.Op, dim, axes, start, shape):
    x, = op.operands
    bd = tuple(op.attrs["broadcast_dimensions"])
    if dim in bd and x.type.shape[bd.index(dim)] != 1:
        x = p.slice_dim(x, bd.index(dim), axes)
    return p.broadcast(x, shape, bd)


def _slice_iota(p: _Partitioner, op: ir.Op, dim, axes, start, shape):
    t = ir.TensorType(shape, op.results[0].type.dtype)
    local = p.emit("iota", [], t, **op.attrs)
    if op.attrs["iota_dimension"] != dim:
        return local
    first = p.emit("convert", [start], ir.TensorType((), t.dtype))
    return p.emit("add", [local, p.broadcast(first, shape, ())], t)


def _slice_scatter(p: _Partitioner, op: ir.Op, dim, axes, start, shape):
    """Scattering into this IPU's rows: the indices shifted by its first
    row; updates out of its range are skipped, as scatter skips updates
    out of bounds."""
    if len(op.operands) != 3:
        return None
    x, indices, updates = op.operands
    dn = op.attrs["scatter_dimension_numbers"]
    if dim not in dn.inserted_window_dims or dim not in dn.scatter_dims_to_operand_dims:
        return None
    it = indices.type
    ivd = dn.index_vector_dim
    k = dn.scatter_dims_to_operand_dims.index(dim)
    kvec = it.shape[ivd] if ivd < len(it.shape) else 1
    offsets = np.zeros(kvec, it.dtype)
    offsets[k] = 1
    vector = p.emit("multiply", [p.emit("constant", [], ir.TensorType((kvec,), it.dtype), value=offsets),
                                 p.broadcast(p.emit("convert", [start], ir.TensorType((), it.dtype)), (kvec,), ())],
                    ir.TensorType((kvec,), it.dtype))
    if ivd < len(it.shape):
        shift = p.broadcast(vector, it.shape, (ivd,))
    else:
        shift = p.broadcast(p.emit("reshape", [vector], ir.TensorType((), it.dtype)), it.shape, ())
    shifted = p.emit("subtract", [indices, shift], it)
    local_x = p.slice_dim(x, dim, axes)
    result = ir.Value(ir.TensorType(shape, op.results[0].type.dtype))
    p.ops.append(ir.Op("scatter", [local_x, shifted, updates], [result], op.attrs, op.regions, p.loc))
    return result


def _slice_transpose(p: _Partitioner, op: ir.Op, dim, axes, start, shape):
    perm = tuple(op.attrs["permutation"])
    x = p.slice_dim(op.operands[0], perm[dim], axes)
    return p.emit("transpose", [x], ir.TensorType(shape, op.results[0].type.dtype), permutation=perm)


def _slice_all_reduce(p: _Partitioner, op: ir.Op, dim, axes, start, shape):
    """This IPU's slice of a sum over the IPUs it is sliced over: a
    reduce_scatter (XLA's partitioner makes the same of an all_reduce whose
    users take slices: ZeRO-1's gradients, sharded like the optimizer
    state). Each IPU then receives its part only, half the link traffic of
    the ring all_reduce; the whole sum need not exist."""
    if len(op.operands) != 1 or not np.array_equal(op.attrs["replica_groups"], p.groups(axes)):
        return None
    result = ir.Value(ir.TensorType(shape, op.results[0].type.dtype))
    p.ops.append(ir.Op("reduce_scatter", list(op.operands), [result],
                       {"replica_groups": p.groups(axes), "use_global_device_ids": True, "scatter_dimension": dim},
                       op.regions, p.loc))
    return result


SLICE_RULES = {"broadcast_in_dim": _slice_broadcast, "iota": _slice_iota, "scatter": _slice_scatter,
               "all_reduce": _slice_all_reduce, "transpose": _slice_transpose}


# custom calls whose result is their operand (sharded alike): moves between
# tile SRAM and streaming memory.
_SHARDING_PRESERVING_CALLS = {"annotate_device_placement"}


def _custom_call(p: _Partitioner, op: ir.Op, operands: list) -> None:
    if str(op.attrs.get("call_target_name")) in _SHARDING_PRESERVING_CALLS and len(operands) == 1:
        return _emit_like(p, op, operands, [p.sharding_of(operands[0])])
    return _gathered(p, op, operands)


def _global_rules() -> dict:
    rules = {name: _elementwise for name in ELEMENTWISE_OPS}
    rules.update(custom_call=_custom_call, broadcast_in_dim=_broadcast_in_dim, transpose=_transpose, reshape=_reshape,
                 dot_general=_dot_general, reduce=_reduce, gather=_gather)
    return rules


GLOBAL_RULES: dict = _global_rules()


def partition(module: ir.Module) -> tuple[ir.Module, tuple | None]:
    """The program one IPU runs, for a module over several partitions, and
    its layout: (mesh, per argument and per result the mesh axes splitting
    each dimension); None for one partition."""
    if module.num_partitions == 1:
        return module, None
    if module.num_replicas != 1:
        raise IpuUnimplementedError(f"program {module.name}: {module.num_replicas} replicas x "
                                    f"{module.num_partitions} partitions is not supported; use one of them")
    partitioner = _Partitioner(module)
    return partitioner.run(), partitioner.layout
