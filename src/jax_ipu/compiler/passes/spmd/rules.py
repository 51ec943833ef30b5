"""One rule per op: which sharding each operand is brought to, and how the
results come out sharded. An op with no rule, or a case a rule does not
take, runs on whole operands (gathered first), which is right for every
op at the price of the gathers: a rule may be missing, never wrong.

A rule is fn(p, op, operands): `p` the Partitioner, `op` the global op,
`operands` this IPU's values for its operands; it sets p.env for the
op's results."""
from __future__ import annotations

import re

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.lowering.reduce import single_op
from jax_ipu.compiler.passes.fuse import reads_of
from jax_ipu.compiler.passes.spmd.sharding import Sharding, layout_of, replicated
from jax_ipu.compiler.passes.spmd.table import gather_from_split_table
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.ops import ELEMENTWISE_OPS

# Reductions whose partial results over IPUs combine with the same op.
_COMBINING = {"add", "multiply", "maximum", "minimum", "and", "or", "xor"}
# Element-wise ops under which partial sums stay partial sums.
_LINEAR = {"add", "subtract", "negate"}


def partition_op(p, op: ir.Op) -> None:
    special = SPECIAL.get(op.name)
    if special is not None:
        return special(p, op)
    operands = [p.env[v] for v in op.operands]
    if all(p.sharding_of(v).replicated for v in operands) and op.name not in REGION_RULES and not (
            op.name == "custom_call" and op.attrs.get("call_target_name") in _CALLS_OF_THEIR_OWN):
        return _as_is(p, op, operands)
    rule = RULES.get(op.name, gathered)
    rule(p, op, operands)


# -- helpers --
def _as_is(p, op: ir.Op, operands: list) -> None:
    """Every IPU computes the same: the op as it is (its regions reading
    every IPU's whole copy of what they read from outside)."""
    results = [ir.Value(r.type) for r in op.results]
    local = ir.Op(op.name, operands, results, op.attrs, _closed_regions(p, op), op.loc)
    p.ops.append(local)
    p.env.update(zip(op.results, results, strict=False))
    if len(results) == 1:
        p.producer[results[0]] = local


def _closed_regions(p, op: ir.Op) -> list[ir.Block]:
    """op's regions reading the whole copy of each value they read from
    outside (a comparator's constants, which JAX hoists out of it)."""
    outer = _outer_reads(op)
    if not outer:
        return op.regions
    renamed = {v: p.whole(p.env[v]) for v in outer}
    return [_renamed(region, renamed) for region in op.regions]


def _outer_reads(op: ir.Op) -> list[ir.Value]:
    def defined(block: ir.Block):
        yield from block.args
        for inner in block.ops:
            yield from inner.results
            for region in inner.regions:
                yield from defined(region)
    inside = {v for region in op.regions for v in defined(region)}
    return list(dict.fromkeys(v for v in reads_of(op, regions_only=True) if v not in inside))


def _renamed(block: ir.Block, renamed: dict) -> ir.Block:
    ops = [ir.Op(inner.name, [renamed.get(v, v) for v in inner.operands], inner.results, inner.attrs,
                 [_renamed(r, renamed) for r in inner.regions], inner.loc) for inner in block.ops]
    return ir.Block(block.args, ops, [renamed.get(v, v) for v in block.results])


def emit_like(p, op: ir.Op, operands: list, shardings: list[Sharding], attrs=None, regions=None) -> None:
    """The op on local operands, its results sharded as given."""
    where = f"{op.name} at {op.loc}"
    results = [ir.Value(p.local_type(r.type, s, where)) for r, s in zip(op.results, shardings, strict=False)]
    p.ops.append(ir.Op(op.name, operands, results, op.attrs if attrs is None else attrs,
                       _closed_regions(p, op) if regions is None else regions, op.loc))
    for old, new, s in zip(op.results, results, shardings, strict=False):
        p.env[old] = new
        p.set(new, s)
    if len(results) == 1 and shardings[0].replicated:
        p.producer[results[0]] = p.ops[-1]      # its slices may be made from slices of its operands


def gathered(p, op: ir.Op, operands: list) -> None:
    """Any op: its operands gathered whole on every IPU, the op run as it is."""
    _as_is(p, op, [p.whole(v) for v in operands])


def _mesh_of(p, values) -> ir.Mesh:
    """The mesh of the first split value (the others are brought to it)."""
    for v in values:
        s = p.sharding_of(v)
        if not s.replicated:
            return s.mesh
    return p.mesh


def _on(p, value, mesh):
    """value as a value on `mesh`: gathered whole if it is split over
    another (a whole value is the same on every mesh)."""
    s = p.sharding_of(value)
    return p.whole(value) if s.mesh != mesh and not s.replicated else value


class _Axes:
    """Mesh axes handed out once each: a value may not be split twice by one axis."""

    def __init__(self, used=()):
        self.used = set(used)

    def take(self, axes) -> tuple[str, ...]:
        kept = tuple(a for a in axes if a not in self.used)
        self.used.update(kept)
        return kept


# -- element-wise --
def elementwise(p, op: ir.Op, operands: list) -> None:
    if op.name == "bitcast_convert" and op.operands[0].type.shape != op.results[0].type.shape:
        return _bitcast_resize(p, op, operands)
    shape = op.results[0].type.shape
    mesh = _mesh_of(p, operands)
    operands = [_on(p, v, mesh) for v in operands]
    full = [v for v, g in zip(operands, op.operands, strict=False) if g.type.shape == shape]
    dims = next((p.sharding_of(v).dims for v in full if any(p.sharding_of(v).dims)), ((),) * len(shape))
    kept, carriers = _partial_kept(p, op, operands, dims)
    target = Sharding(mesh, dims)
    local = []
    for i, (v, g) in enumerate(zip(operands, op.operands, strict=False)):
        if g.type.shape != shape:       # a scalar bound of clamp, a scalar predicate of select
            local.append(p.whole(v))
        else:
            local.append(p.reshard(v, Sharding(mesh, dims, kept) if i in carriers else target))
    emit_like(p, op, local, [Sharding(mesh, dims, kept)] * len(op.results))


def _partial_kept(p, op: ir.Op, operands: list, dims) -> tuple[frozenset, set[int]]:
    """The axes over which the result may stay partial sums, and the
    operands that carry them: the op is linear in those (a + b and a - b
    with both partial alike, -a, select(q, a, b)), and none of the axes
    splits a dimension of the result. (Products with whole values are
    linear too, but a partial value is then often summed twice, once
    scaled and once not: it is summed before them, once.)"""
    partial = [p.sharding_of(v).unreduced for v in operands]
    none = (frozenset(), set())
    if not any(partial) or any(v.type.shape != operands[0].type.shape for v in operands):
        return none
    n = len(operands)
    if op.name in ("add", "subtract", "negate") and len(set(partial)) == 1:
        kept, carriers = partial[0], set(range(n))
    elif op.name == "select" and not partial[0] and len(set(partial[1:])) == 1:
        kept, carriers = partial[1], {1, 2}
    else:
        return none
    if kept & {a for axes in dims for a in axes}:
        return none
    return kept, carriers


def _bitcast_resize(p, op: ir.Op, operands: list) -> None:
    """A bitcast between element sizes adds or removes a last dimension,
    which stays whole."""
    x, = operands
    s = p.sharding_of(p.reduced(x))
    n_in, n_out = len(op.operands[0].type.shape), len(op.results[0].type.shape)
    dims = s.dims if n_out > n_in else s.dims[:-1] + ((),)
    x = p.reshard(x, s.with_dims(dims))
    out = dims + ((),) if n_out > n_in else dims[:-1]
    emit_like(p, op, [x], [Sharding(s.mesh, out)])


# -- layout --
def broadcast_in_dim(p, op: ir.Op, operands: list) -> None:
    x, = operands
    s = p.sharding_of(x)
    in_shape, out_shape = op.operands[0].type.shape, op.results[0].type.shape
    dims = [()] * len(out_shape)
    kept = list(s.dims)
    for i, d in enumerate(op.attrs["broadcast_dimensions"]):
        if in_shape[i] == out_shape[d]:
            dims[d] = s.dims[i]
        else:
            kept[i] = ()
    x = p.reshard(x, s.with_dims(kept))
    emit_like(p, op, [x], [Sharding(s.mesh, tuple(dims), s.unreduced)])


def transpose(p, op: ir.Op, operands: list) -> None:
    s = p.sharding_of(operands[0])
    emit_like(p, op, operands, [s.with_dims([s.dims[d] for d in op.attrs["permutation"]])])


def _reshape_groups(a: tuple, b: tuple) -> list[tuple[list[int], list[int]]]:
    """The dimensions of shapes a and b in groups of equal products
    (a reshape splits and merges within groups)."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        ia, jb = [], []
        pa = pb = 1
        while True:
            if i < len(a) and (pa < pb or (pa == pb and not ia) or (j >= len(b))):
                pa *= a[i]
                ia.append(i)
                i += 1
            elif j < len(b) and (pb < pa or not jb):
                pb *= b[j]
                jb.append(j)
                j += 1
            else:
                break
            if pa == pb and ia and jb:
                # Take the size-1 dimensions that follow into this group.
                while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
                    ia.append(i)
                    i += 1
                while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
                    jb.append(j)
                    j += 1
                break
        if pa != pb:
            return []
        groups.append((ia, jb))
    return groups


def reshape(p, op: ir.Op, operands: list) -> None:
    """Within each group of dimensions a reshape merges and splits, the
    split dimensions keep their axes where each IPU's part stays one block
    of the group's elements in order; other splits are gathered first."""
    x, = operands
    s = p.sharding_of(x)
    a, b = op.operands[0].type.shape, op.results[0].type.shape
    sizes = s.sizes
    groups = _reshape_groups(a, b) if 0 not in a else []
    if not groups:
        return gathered(p, op, operands)
    kept = list(s.dims)
    out = [()] * len(b)
    for ia, jb in groups:
        # A block of the group: the dimensions before the last split one
        # split to size 1 (else the later ones are gathered).
        flat = []
        for k, d in enumerate(ia):
            if not kept[d]:
                continue
            if any(a[e] // int(np.prod([sizes[x] for x in kept[e]], dtype=np.int64)) > 1 for e in ia[:k]):
                kept[d] = ()
                continue
            flat.extend(kept[d])
        # ... handed out to the output dimensions, major first.
        carried = True
        for d in jb:
            if not flat:
                break
            total = int(np.prod([sizes[x] for x in flat], dtype=np.int64))
            if total <= b[d]:
                carried = b[d] % total == 0
                out[d], flat = tuple(flat), []
            else:
                prefix, product = [], 1
                while flat and product < b[d]:
                    product *= sizes[flat[0]]
                    prefix.append(flat.pop(0))
                carried = product == b[d]
                out[d] = tuple(prefix)
            if not carried:
                break
        if not carried or flat:      # the split could not be carried over: the group gathered
            for d in ia:
                kept[d] = ()
            for d in jb:
                out[d] = ()
    x = p.reshard(x, s.with_dims(kept))
    emit_like(p, op, [x], [Sharding(s.mesh, tuple(out), s.unreduced)])


def _keep_dims(p, op: ir.Op, operands: list, keep, local_attrs=None) -> None:
    """Ops that work along some dimensions only (slice, pad, reverse, sort
    ...): the others keep their split; `keep(d)` says which. Every operand
    of the first's rank is split alike, others (scalars) are whole.
    local_attrs(sizes) gives the op's attributes for the local sizes of
    the dimensions kept split, where they name sizes."""
    mesh = _mesh_of(p, operands)
    operands = [_on(p, p.reduced(v), mesh) for v in operands]
    rank = len(op.operands[0].type.shape)
    s = p.sharding_of(operands[0])
    want = Sharding(mesh, tuple(axes if keep(d) else () for d, axes in enumerate(s.dims)))
    local = [p.reshard(v, want) if len(g.type.shape) == rank else p.whole(v) for v, g in zip(operands, op.operands, strict=False)]
    attrs = None
    if local_attrs is not None:
        attrs = local_attrs(want.local_shape(op.operands[0].type.shape, f"{op.name} at {op.loc}"))
    emit_like(p, op, local, [want if len(r.type.shape) == rank else replicated(mesh, len(r.type.shape))
                             for r in op.results], attrs=attrs)


def slice_(p, op: ir.Op, operands: list) -> None:
    shape = op.operands[0].type.shape
    starts, limits, strides = op.attrs["start_indices"], op.attrs["limit_indices"], op.attrs["strides"]

    def local_attrs(sizes):
        return {**op.attrs, "limit_indices": tuple(sizes[d] if shape[d] != sizes[d] else limit
                                                   for d, limit in enumerate(limits))}
    _keep_dims(p, op, operands, lambda d: starts[d] == 0 and limits[d] == shape[d] and strides[d] == 1,
               local_attrs)


def pad(p, op: ir.Op, operands: list) -> None:
    lo, hi, inner = op.attrs["edge_padding_low"], op.attrs["edge_padding_high"], op.attrs["interior_padding"]
    _keep_dims(p, op, operands, lambda d: lo[d] == hi[d] == inner[d] == 0)


def reverse(p, op: ir.Op, operands: list) -> None:
    """A reversed split dimension keeps its split: each IPU reverses its
    block and takes the one of the IPU mirrored along the dimension's axes
    (a collective permute), as XLA's partitioner does."""
    x = p.reduced(operands[0])
    s = p.sharding_of(x)
    out = p.emit("reverse", [x], x.type, dimensions=tuple(op.attrs["dimensions"]))
    for d in op.attrs["dimensions"]:
        axes = s.dims[d]
        if not axes:
            continue
        pairs = [(int(g[c]), int(g[len(g) - 1 - c])) for g in p.groups(s.mesh, axes) for c in range(len(g))]
        out = p.emit("collective_permute", [out], x.type,
                     source_target_pairs=np.asarray(pairs, np.int64))
    p.env[op.results[0]] = p.set(out, s)


def sort(p, op: ir.Op, operands: list) -> None:
    along = op.attrs["dimension"]
    _keep_dims(p, op, operands, lambda d: d != along)


def concatenate(p, op: ir.Op, operands: list) -> None:
    along = op.attrs["dimension"]
    mesh = _mesh_of(p, operands)
    operands = [_on(p, p.reduced(v), mesh) for v in operands]
    s = next((p.sharding_of(v) for v in operands if any(p.sharding_of(v).dims)), p.sharding_of(operands[0]))
    want = Sharding(mesh, tuple(() if d == along else axes for d, axes in enumerate(s.dims)))
    emit_like(p, op, [p.reshard(v, want) for v in operands], [want])


def dynamic_slice(p, op: ir.Op, operands: list) -> None:
    """Dimensions taken whole keep their split (their start is clamped to 0)."""
    shape, sizes = op.operands[0].type.shape, op.attrs["slice_sizes"]
    x, *starts = operands
    s = p.sharding_of(p.reduced(x))
    want = s.with_dims([axes if sizes[d] == shape[d] else () for d, axes in enumerate(s.dims)])
    local = want.local_shape(shape, f"{op.name} at {op.loc}")
    emit_like(p, op, [p.reshard(x, want), *[p.whole(v) for v in starts]], [want],
              attrs={**op.attrs, "slice_sizes": tuple(local[d] if want.dims[d] else n for d, n in enumerate(sizes))})


def dynamic_update_slice(p, op: ir.Op, operands: list) -> None:
    shape, sizes = op.operands[0].type.shape, op.operands[1].type.shape
    x, update, *starts = operands
    mesh = _mesh_of(p, [x, update])
    x, update = _on(p, p.reduced(x), mesh), _on(p, p.reduced(update), mesh)
    s = p.sharding_of(x) if any(p.sharding_of(x).dims) else p.sharding_of(update)
    want = Sharding(mesh, tuple(axes if sizes[d] == shape[d] else () for d, axes in enumerate(s.dims)))
    emit_like(p, op, [p.reshard(x, want), p.reshard(update, want), *[p.whole(v) for v in starts]], [want])


# -- contractions and reductions --
def dot_general(p, op: ir.Op, operands: list) -> None:
    """Batch and contracting dimensions split alike on both sides, free
    dimensions keep their split (each axis used once); a split contracting
    dimension leaves partial sums over its axes (added up where a later op
    needs the sum, by an all_reduce or, into a split result, a
    reduce_scatter)."""
    dn = op.attrs["dot_dimension_numbers"]
    mesh = _mesh_of(p, operands)
    lhs, rhs = [_on(p, p.reduced(v), mesh) for v in operands]
    ls, rs = p.sharding_of(lhs), p.sharding_of(rhs)
    lb, rb = dn.lhs_batching_dimensions, dn.rhs_batching_dimensions
    lc, rc = dn.lhs_contracting_dimensions, dn.rhs_contracting_dimensions
    lf = [d for d in range(len(ls.dims)) if d not in lb + lc]
    rf = [d for d in range(len(rs.dims)) if d not in rb + rc]
    axes = _Axes()
    ldims, rdims = [()] * len(ls.dims), [()] * len(rs.dims)
    for l, r in zip(lb, rb, strict=False):
        ldims[l] = rdims[r] = axes.take(ls.dims[l] or rs.dims[r])
    for d in lf:
        ldims[d] = axes.take(ls.dims[d])
    for d in rf:
        rdims[d] = axes.take(rs.dims[d])
    for l, r in zip(lc, rc, strict=False):
        ldims[l] = rdims[r] = axes.take(ls.dims[l] or rs.dims[r])
    lhs, rhs = p.reshard(lhs, Sharding(mesh, tuple(ldims))), p.reshard(rhs, Sharding(mesh, tuple(rdims)))
    out = tuple([ldims[d] for d in lb] + [ldims[d] for d in lf] + [rdims[d] for d in rf])
    summed = frozenset(a for d in lc for a in ldims[d])
    emit_like(p, op, [lhs, rhs], [Sharding(mesh, out, summed)])


def convolution(p, op: ir.Op, operands: list) -> None:
    """The batch and the output features keep their split; split input
    features leave partial sums; spatial dimensions are taken whole."""
    dn = op.attrs["dimension_numbers"]
    mesh = _mesh_of(p, operands)
    lhs, rhs = [_on(p, p.reduced(v), mesh) for v in operands]
    ls, rs = p.sharding_of(lhs), p.sharding_of(rhs)
    groups = int(op.attrs.get("feature_group_count", 1)), int(op.attrs.get("batch_group_count", 1))
    axes = _Axes()
    ldims, rdims = [()] * len(ls.dims), [()] * len(rs.dims)
    out = [()] * len(op.results[0].type.shape)
    if groups[1] == 1:
        ldims[dn.input_batch_dimension] = out[dn.output_batch_dimension] = axes.take(ls.dims[dn.input_batch_dimension])
    if groups == (1, 1):
        rdims[dn.kernel_output_feature_dimension] = out[dn.output_feature_dimension] = axes.take(
            rs.dims[dn.kernel_output_feature_dimension])
        ldims[dn.input_feature_dimension] = rdims[dn.kernel_input_feature_dimension] = axes.take(
            ls.dims[dn.input_feature_dimension] or rs.dims[dn.kernel_input_feature_dimension])
    lhs, rhs = p.reshard(lhs, Sharding(mesh, tuple(ldims))), p.reshard(rhs, Sharding(mesh, tuple(rdims)))
    summed = frozenset(ldims[dn.input_feature_dimension])
    emit_like(p, op, [lhs, rhs], [Sharding(mesh, tuple(out), summed)])


def _identity_of(p, which: str, init: ir.Value) -> bool:
    """Whether the (global) init value is the identity of `which`, so that
    each IPU may start from it."""
    op = p.defining.get(init)
    if op is None or op.name != "constant":
        return False
    v = np.asarray(op.attrs["value"])
    if v.size != 1:
        return False
    v = v.reshape(())
    dtype = v.dtype
    if which in ("add", "or", "xor"):
        return not v.any()
    if which == "multiply":
        return v == 1
    if which == "and":
        return bool(v) if dtype == np.bool_ else (v == ~np.zeros((), dtype) if dtype.kind in "iu" else False)
    low = -np.inf if dtype.kind == "f" else (False if dtype == np.bool_ else np.iinfo(dtype).min)
    high = np.inf if dtype.kind == "f" else (True if dtype == np.bool_ else np.iinfo(dtype).max)
    return v == (low if which == "maximum" else high) if which in ("maximum", "minimum") else False


def reduce(p, op: ir.Op, operands: list) -> None:
    """Each IPU reduces its part; reduced split dimensions are combined
    (a sum left as partial sums, others by an all_reduce with the body's
    op); a body that is not one such op has its reduced dimensions
    gathered first."""
    n = len(operands) // 2
    which = single_op(op.regions[0]) if n == 1 else None
    mesh = _mesh_of(p, operands[:n])
    xs = [_on(p, v, mesh) for v in operands[:n]]
    inits = [p.whole(v) for v in operands[n:]]
    if which != "add":
        xs = [p.reduced(v) for v in xs]
    s = p.sharding_of(xs[0])
    reduced_dims = set(op.attrs["dimensions"])
    summed = tuple(a for d in sorted(reduced_dims) for a in s.dims[d])
    combine = which in _COMBINING and (not summed or _identity_of(p, which, op.operands[n]))
    if summed and not combine:
        s = Sharding(mesh, tuple(() if d in reduced_dims else axes for d, axes in enumerate(s.dims)))
        summed = ()
    xs = [p.reshard(v, s) for v in xs]
    kept = tuple(axes for d, axes in enumerate(s.dims) if d not in reduced_dims)
    partial = s.unreduced | (frozenset(summed) if which == "add" else frozenset())
    emit_like(p, op, xs + inits, [Sharding(mesh, kept, partial)] * n)
    if summed and which != "add":
        result = p.env[op.results[0]]
        total = p.all_reduce(result, mesh, tuple(a for a, _ in mesh.axes if a in summed), which)
        p.env[op.results[0]] = p.set(total, Sharding(mesh, kept))


def _window_rule(p, op: ir.Op, operands: list, n: int) -> None:
    """reduce_window and select_and_scatter: dimensions with a window of one
    element, no stride, padding or dilation keep their split."""
    rank = len(op.operands[0].type.shape)
    wd = op.attrs.get("window_dimensions", (1,) * rank)
    trivial = {"window_strides": 1, "base_dilations": 1, "window_dilations": 1}

    def keep(d):
        if wd[d] != 1:
            return False
        if any(op.attrs.get(k) is not None and tuple(op.attrs[k])[d] != v for k, v in trivial.items()):
            return False
        padding = op.attrs.get("padding")
        return padding is None or tuple(np.asarray(padding).reshape(rank, 2)[d]) == (0, 0)
    mesh = _mesh_of(p, operands[:n])
    xs = [_on(p, p.reduced(v), mesh) for v in operands]
    s = p.sharding_of(xs[0])
    want = s.with_dims([axes if keep(d) else () for d, axes in enumerate(s.dims)])
    local = [p.reshard(v, want) if len(g.type.shape) == rank else p.whole(v)
             for v, g in zip(xs, op.operands, strict=False)]
    emit_like(p, op, local, [want] * len(op.results))


def reduce_window(p, op, operands):
    _window_rule(p, op, operands, len(operands) // 2)


def select_and_scatter(p, op, operands):
    # operand and source split alike where the window is one element: the
    # source has the operand's shape there.
    _window_rule(p, op, operands, 2)


# -- indexing --
def gather(p, op: ir.Op, operands: list) -> None:
    x, indices = [p.reduced(v) for v in operands]
    if gather_from_split_table(p, op, x, indices):
        return
    dn, sizes = op.attrs["dimension_numbers"], op.attrs["slice_sizes"]
    mesh = _mesh_of(p, [x, indices])
    x, indices = _on(p, x, mesh), _on(p, indices, mesh)
    xs, ins = p.sharding_of(x), p.sharding_of(indices)
    rank = len(op.results[0].type.shape)
    xshape = op.operands[0].type.shape
    batch_out = [d for d in range(rank) if d not in dn.offset_dims]
    index_batch = [d for d in range(len(ins.dims)) if d != dn.index_vector_dim]
    window = [d for d in range(len(xs.dims)) if d not in dn.collapsed_slice_dims + dn.operand_batching_dims]
    axes = _Axes()
    xd, idd, out = [()] * len(xs.dims), [()] * len(ins.dims), [()] * rank
    for ob, ib in zip(dn.operand_batching_dims, dn.start_indices_batching_dims, strict=False):
        xd[ob] = idd[ib] = out[batch_out[index_batch.index(ib)]] = axes.take(xs.dims[ob] or ins.dims[ib])
    for k, d in enumerate(window):
        if sizes[d] == xshape[d]:
            xd[d] = out[dn.offset_dims[k]] = axes.take(xs.dims[d])
    for k, d in enumerate(index_batch):
        if d not in dn.start_indices_batching_dims:
            idd[d] = out[batch_out[k]] = axes.take(ins.dims[d])
    want = Sharding(mesh, tuple(xd))
    x, indices = p.reshard(x, want), p.reshard(indices, Sharding(mesh, tuple(idd)))
    local = want.local_shape(xshape, f"gather at {op.loc}")
    emit_like(p, op, [x, indices], [Sharding(mesh, tuple(out))],
              attrs={**op.attrs, "slice_sizes": tuple(local[d] if xd[d] and size == xshape[d] else size
                                                  for d, size in enumerate(sizes))})


def scatter(p, op: ir.Op, operands: list) -> None:
    """Operand dimensions every update covers whole keep their split (the
    updates split alike there), and batched dimensions theirs; the
    scattered dimensions of the indices and updates are taken whole."""
    n = (len(operands) - 1) // 2
    dn = op.attrs["scatter_dimension_numbers"]
    mesh = _mesh_of(p, operands)
    vals = [_on(p, p.reduced(v), mesh) for v in operands]
    xs_, indices, updates = vals[:n], vals[n], vals[n + 1:]
    xshape, ushape = op.operands[0].type.shape, op.operands[n + 1].type.shape
    s, ins = p.sharding_of(xs_[0]), p.sharding_of(indices)
    window = [d for d in range(len(xshape)) if d not in dn.inserted_window_dims + dn.input_batching_dims]
    update_scatter = [d for d in range(len(ushape)) if d not in dn.update_window_dims]
    index_batch = [d for d in range(len(ins.dims)) if d != dn.index_vector_dim]
    axes = _Axes()
    xd, idd, ud = [()] * len(xshape), [()] * len(ins.dims), [()] * len(ushape)
    for ob, ib in zip(dn.input_batching_dims, dn.scatter_indices_batching_dims, strict=False):
        xd[ob] = idd[ib] = ud[update_scatter[index_batch.index(ib)]] = axes.take(s.dims[ob] or ins.dims[ib])
    for k, d in enumerate(window):
        u = dn.update_window_dims[k]
        if ushape[u] == xshape[d]:
            xd[d] = ud[u] = axes.take(s.dims[d])
    summed = frozenset()
    if n == 1 and single_op(op.regions[0]) == "add":
        # Updates split along their scattered dimensions (data-parallel
        # gradients of an embedding, segment sums): each IPU adds its own
        # into its copy of the operand, leaving partial sums (the operand
        # itself counted once: on the first IPU, unless it is zeros).
        us = p.sharding_of(updates[0])
        for k, d in enumerate(index_batch):
            if d in dn.scatter_indices_batching_dims:
                continue
            u = update_scatter[k]
            shared = axes.take(ins.dims[d] or us.dims[u])
            idd[d] = ud[u] = shared
            summed |= frozenset(shared)
    want_x, want_u = Sharding(mesh, tuple(xd)), Sharding(mesh, tuple(ud))
    xs_ = [p.reshard(v, want_x) for v in xs_]
    if summed and not _zeros(p, op.operands[0]):
        xs_ = [p.reshard(v, Sharding(mesh, tuple(xd), summed)) for v in xs_]
    local = xs_ + [p.reshard(indices, Sharding(mesh, tuple(idd)))] + [p.reshard(v, want_u) for v in updates]
    emit_like(p, op, local, [Sharding(mesh, tuple(xd), summed)] * n)


def _zeros(p, value: ir.Value) -> bool:
    """Whether the (global) value is a broadcast zero."""
    op = p.defining.get(value)
    while op is not None and op.name == "broadcast_in_dim":
        op = p.defining.get(op.operands[0])
    return op is not None and op.name == "constant" and not np.asarray(op.attrs["value"]).any()


# -- collectives a shard_map body names (over its manual axes) --
def _collective_keep(p, op: ir.Op, operands: list, whole_dims=()) -> None:
    """The collective on each IPU's part: it runs over manual axes, while
    the parts are split over the others; `whole_dims` are taken whole."""
    mesh = _mesh_of(p, operands)
    local, out = [], []
    for v, r in zip(operands, op.results, strict=False):
        v = _on(p, p.reduced(v), mesh)
        s = p.sharding_of(v)
        want = s.with_dims([() if d in whole_dims else axes for d, axes in enumerate(s.dims)])
        local.append(p.reshard(v, want))
        out.append(want if len(r.type.shape) == len(want.dims) else replicated(mesh, len(r.type.shape)))
    emit_like(p, op, local, out)


def all_gather(p, op, operands):
    _collective_keep(p, op, operands, (op.attrs["all_gather_dim"],))


def reduce_scatter(p, op, operands):
    _collective_keep(p, op, operands, (op.attrs["scatter_dimension"],))


def all_to_all(p, op, operands):
    _collective_keep(p, op, operands, (op.attrs["split_dimension"], op.attrs["concat_dimension"]))


def all_reduce(p, op, operands):
    _collective_keep(p, op, operands)


# -- ops that carry their operands' shardings through --
def optimization_barrier(p, op: ir.Op, operands: list) -> None:
    emit_like(p, op, operands, [p.sharding_of(v) for v in operands])


# Custom calls partitioned by custom_call below even on whole values.
_CALLS_OF_THEIR_OWN = {"InspectSharding", "annotate_device_placement"}


def custom_call(p, op: ir.Op, operands: list) -> None:
    target = str(op.attrs.get("call_target_name"))
    if target == "annotate_device_placement" and len(operands) == 1:
        # A move between tile SRAM and streaming memory: its result is its
        # operand, sharded alike (and resharded before the move, see
        # Partitioner.place).
        p.env[op.results[0]] = p.place(operands[0], p.sharding_of(operands[0]), op)
        return None
    if target == "LayoutConstraint" and len(operands) == 1:    # a layout: sharded as its operand
        return emit_like(p, op, operands, [p.sharding_of(operands[0])])
    if target == "InspectSharding" and len(operands) == 1:
        # jax.debug.inspect_array_sharding: JAX's callback is told the
        # operand's sharding; the value goes on unchanged.
        config = op.attrs.get("backend_config")
        if p.inspect_sharding is not None and isinstance(config, bytes):
            p.inspect_sharding(config, layout_of(p.sharding_of(operands[0])))
        for r in op.results:
            p.env[r] = operands[0]
        return None
    return gathered(p, op, operands)


# -- control flow: regions partitioned in place --
def while_(p, op: ir.Op) -> None:
    """Each carried value keeps one sharding through the loop: the one the
    body gives it when that differs from the one it enters with (a
    constraint inside the loop, gradients summed as partial sums), else the
    one it enters with; the body's results are brought to it, and the
    condition is whole."""
    operands = [p.env[v] for v in op.operands]
    cond, body = op.regions
    shardings = [p.sharding_of(v) for v in operands]
    for _ in range(2):
        _, made = p.region(body, shardings)
        if made == shardings:
            break
        made = [m if _splits_evenly(m, v.type) else s for m, s, v in zip(made, shardings, op.operands, strict=False)]
        if made == shardings:
            break
        shardings = made
    operands = [p.reshard(v, s) for v, s in zip(operands, shardings, strict=False)]
    local_body, _ = p.region(body, shardings, shardings)
    local_cond, _ = p.region(cond, shardings, [replicated(p.mesh, 0)])
    emit_like(p, op, operands, shardings, regions=[local_cond, local_body])


def _splits_evenly(s: Sharding, t) -> bool:
    if not isinstance(t, ir.TensorType):
        return True
    return all(n % s.splits(d) == 0 for d, n in enumerate(t.shape))


def case(p, op: ir.Op) -> None:
    """Branches partitioned; each result split as all branches make it, or
    else whole."""
    index = p.whole(p.env[op.operands[0]])
    rest = [p.env[v] for v in op.operands[1:]]
    firsts = []
    for branch in op.regions:
        _, shardings = p.region(branch, [])
        firsts.append(shardings)
    want = []
    for i, r in enumerate(op.results):
        options = {s[i] for s in firsts}
        s = options.pop() if len(options) == 1 else None
        want.append(s if s is not None else replicated(p.mesh, len(getattr(r.type, "shape", ()))))
    branches = [p.region(branch, [], want)[0] for branch in op.regions]
    emit_like(p, op, [index, *rest], want, regions=branches)


def call(p, op: ir.Op) -> None:
    """A call of a function (a nested jit: jnp.where, log_softmax, take):
    its body partitioned in place, so that parts flow through it."""
    body = p.functions[op.attrs["callee"]].body
    p.env.update((a, p.env[v]) for a, v in zip(body.args, op.operands, strict=False))
    for inner in body.ops:
        p.loc = inner.loc
        for r in inner.results:
            p.defining[r] = inner
        partition_op(p, inner)
    p.loc = op.loc
    p.env.update((r, p.env[v]) for r, v in zip(op.results, body.results, strict=False))


def sharding_constraint(p, op: ir.Op) -> None:
    """with_sharding_constraint, jax.sharding.reshard: the value brought to
    the sharding named (open dimensions may keep a further split)."""
    value = p.env[op.operands[0]]
    text = op.attrs.get("sharding")
    if text is None:
        p.env[op.results[0]] = value
        return
    want = p.spec(text, f"{op.name} at {op.loc}").resolve(p.sharding_of(value), p.manual)
    shape = getattr(op.results[0].type, "shape", ())
    if len(want.dims) != len(shape):
        raise IpuUnimplementedError(f"{op.name} at {op.loc}: sharding {text} does not match the value's rank")
    p.env[op.results[0]] = p.reshard(value, _even(want, shape))


def _even(s: Sharding, shape) -> Sharding:
    """The sharding with each dimension split by the longest leading run of
    its axes that splits it evenly: a constraint on a value inside the
    program places it, it does not change it (XLA pads the uneven parts;
    jax-ipu keeps them whole)."""
    sizes, dims = s.sizes, []
    for axes, n in zip(s.dims, shape, strict=False):
        k, parts = 0, 1
        while k < len(axes) and n % (parts * sizes[axes[k]]) == 0:
            parts *= sizes[axes[k]]
            k += 1
        dims.append(tuple(axes[:k]))
    return s.with_dims(dims)


def manual_computation(p, op: ir.Op) -> None:
    """shard_map: the body runs on each IPU's part as it is for the manual
    axes; over the mesh's other axes (a partly manual shard_map) its ops
    are partitioned like any others."""
    where = f"shard_map at {op.loc}"
    ins = p.spec_list(op.attrs.get("in_shardings", ""), where)
    outs = p.spec_list(op.attrs.get("out_shardings", ""), where)
    manual = frozenset(_names(str(op.attrs.get("manual_axes", ""))))
    body = op.regions[0]
    for i, (value, arg) in enumerate(zip(op.operands, body.args, strict=False)):
        local = p.env[value]
        if not isinstance(value.type, ir.TensorType):    # a token: nothing to split
            p.env[arg] = local
            continue
        spec = ins[i] if i < len(ins) else None
        want = spec.resolve(p.sharding_of(local), p.manual, manual) if spec else replicated(p.mesh, len(arg.type.shape))
        local = p.reshard(local, want)
        inner = _without(want, manual, where)
        if p.local_type(arg.type, inner, where) != local.type:
            raise IpuUnimplementedError(f"{where}: operand {i} is {local.type} on each IPU but the body takes "
                                        f"{arg.type} split as {inner.describe()}")
        # The body's argument is a new name for this IPU's part, sharded
        # over the axes that stay automatic.
        p.env[arg] = _alias(p, local, inner)
    saved = p.manual
    p.manual = saved | manual
    try:
        p.walk(body)
        results = []
        for i, value in enumerate(body.results):
            local = p.env[value]
            if not isinstance(value.type, ir.TensorType):
                results.append((local, None))
                continue
            spec = outs[i] if i < len(outs) else None
            s = p.sharding_of(local)
            want = spec.resolve(None, saved) if spec else replicated(p.mesh, len(value.type.shape))
            inner = _without(want, manual, where)
            if spec is not None:
                # Open dimensions may keep the body's own further split.
                inner = _keep_open(spec, inner, s, manual)
                want = _with_manual(want, inner, manual)
            results.append((p.reshard(local, inner), want))
    finally:
        p.manual = saved
    for old, (local, want) in zip(op.results, results, strict=False):
        p.env[old] = local if want is None else _alias(p, local, want)


def sharding_group(p, op: ir.Op) -> None:
    """shard_alike: the values of one group end up split alike, as the most
    split of them is (those read already keep what they were read as)."""
    group = p.sharding_groups.setdefault(int(op.attrs["group_id"]), [])
    group.append(op.operands[0])
    target = max((p.sharding_of(p.env[v]) for v in group), key=lambda s: (sum(s.splits(d) for d in range(len(
        s.dims))), -len(s.unreduced)))
    target = target.reduced()
    for v in group:
        p.env[v] = p.reshard(p.env[v], target)


def _names(text: str) -> list[str]:
    return re.findall(r'"([^"]+)"', text)


def _without(s: Sharding, manual: frozenset, where: str) -> Sharding:
    """A sharding as seen inside the manual axes: they lead each
    dimension's axes and are dropped."""
    dims = []
    for axes in s.dims:
        k = 0
        while k < len(axes) and axes[k] in manual:
            k += 1
        if any(a in manual for a in axes[k:]):
            raise IpuUnimplementedError(f"{where}: manual mesh axes must come first in a dimension's sharding "
                                        f"({', '.join(axes)})")
        dims.append(axes[k:])
    return Sharding(s.mesh, tuple(dims), frozenset(a for a in s.unreduced if a not in manual))


def _keep_open(spec, inner: Sharding, have: Sharding, manual) -> Sharding:
    dims = list(inner.dims)
    named = {a for d in dims for a in d} | set(inner.unreduced)
    for d, axes in enumerate(dims):
        kept = have.dims[d] if d < len(have.dims) else ()
        if spec.open[d] and have.mesh == inner.mesh and kept[:len(axes)] == axes and not (
                set(kept[len(axes):]) & named):
            named |= set(kept)
            dims[d] = kept
    return inner.with_dims(dims)


def _with_manual(want: Sharding, inner: Sharding, manual) -> Sharding:
    dims = []
    for w, i in zip(want.dims, inner.dims, strict=False):
        lead = tuple(a for a in w if a in manual)
        dims.append(lead + i)
    return Sharding(want.mesh, tuple(dims), want.unreduced)


def _alias(p, local: ir.Value, s: Sharding) -> ir.Value:
    """The same local value seen with another sharding (entering or leaving
    a shard_map's manual axes): a new name, so that each keeps its own."""
    if p.sharding_of(local) == s:
        return local
    alias = ir.Value(local.type)
    p.ops.append(ir.Op("sharding_constraint", [local], [alias], {}, [], p.loc))   # an identity (legalize)
    return p.set(alias, s)


RULES = {name: elementwise for name in ELEMENTWISE_OPS}
RULES.update(broadcast_in_dim=broadcast_in_dim, transpose=transpose, reshape=reshape, slice=slice_, pad=pad,
             reverse=reverse, sort=sort, concatenate=concatenate, dynamic_slice=dynamic_slice,
             dynamic_update_slice=dynamic_update_slice, dot_general=dot_general, convolution=convolution,
             reduce=reduce, reduce_window=reduce_window, select_and_scatter=select_and_scatter, gather=gather,
             scatter=scatter, all_gather=all_gather, reduce_scatter=reduce_scatter, all_to_all=all_to_all,
             all_reduce=all_reduce, collective_permute=all_reduce, optimization_barrier=optimization_barrier,
             custom_call=custom_call)
REGION_RULES = {"while", "case"}
SPECIAL = {"while": while_, "case": case, "call": call, "sdy.sharding_constraint": sharding_constraint,
           "sdy.reshard": sharding_constraint, "sharding_constraint": sharding_constraint,
           "sdy.manual_computation": manual_computation, "sdy.sharding_group": sharding_group}
