"""Executors of the indexing and sorting kernels (graph.codelets_indexing),
with XLA's semantics: gather and dynamic slices clamp their starts into
bounds, scatter skips out-of-bounds windows and combines duplicates in
order, sorts are stable. Sorting by an arbitrary comparator is a bottom-up
merge sort whose merges find each element's place by binary search, every
comparison of a pass evaluated at once over all rows."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jax_ipu.graph import codelets_indexing as ci
from jax_ipu.graph.views import View
from jax_ipu.model.executors.elementwise import instruction
from jax_ipu.model.registry import reference
from jax_ipu.ops import REDUCE_OPS, total_order_key
from jax_ipu.targets import is_float


def clamped_window(starts, shape, sizes, read) -> Callable:
    """fn(state) -> the slices of a dynamic slice's window, each start
    clamped so that the window fits (as XLA). Constant starts are clamped
    once, here; a start read from a tensor (a loop counter) on each run."""
    parts = []
    for source, dim, size in zip(starts, shape, sizes, strict=True):
        if isinstance(source, View):
            parts.append((read(source), dim - size, size))
        else:
            start = min(max(int(np.asarray(source).reshape(())), 0), dim - size)
            parts.append(slice(start, start + size))
    if all(type(part) is slice for part in parts):
        fixed = tuple(parts)
        return lambda state: fixed

    def window(state):
        out = []
        for part in parts:
            if type(part) is slice:
                out.append(part)
            else:
                get, last, size = part
                start = get(state).item()
                start = 0 if start < 0 else last if start > last else start
                out.append(slice(start, start + size))
        return tuple(out)
    return window


@reference(ci.DynamicSlice)
def _build_dynamic_slice(k: ci.DynamicSlice, read):
    get, tid = read(k.operand), k.out.id
    window = clamped_window(k.starts, k.operand.shape, k.out.shape, read)

    def run(state):
        state[tid] = np.array(get(state)[window(state)])
    return run


@reference(ci.DynamicUpdateSlice)
def _build_dynamic_update_slice(k: ci.DynamicUpdateSlice, read):
    get, update, tid = read(k.operand), read(k.update), k.out.id
    window = clamped_window(k.starts, k.operand.shape, k.update.shape, read)

    # The compiler writes the result into the operand's tensor when nothing
    # reads the operand afterwards.
    in_place, shape, out_shape = k.out is k.operand.tensor, k.operand.shape, k.out.shape

    def run(state):
        target = state[tid] if in_place else None
        if target is not None and target.flags.writeable:
            out = target.reshape(shape)     # the same memory, unless laid out otherwise
        else:
            out = np.array(get(state))
        out[window(state)] = update(state)
        state[tid] = out.reshape(out_shape)
    return run


def _batch_index(shape: tuple[int, ...], axis: int) -> np.ndarray:
    """arange(shape[axis]) shaped to broadcast along `axis` of `shape`."""
    expand = [1] * len(shape)
    expand[axis] = shape[axis]
    return np.arange(shape[axis]).reshape(expand)


def _index_vectors(indices: np.ndarray, index_vector_dim: int) -> tuple[np.ndarray, list[int]]:
    """(indices as [*batch, k] int64, the original dims of the batch axes)."""
    if index_vector_dim == indices.ndim:
        indices = indices[..., None]
    batch_dims = [d for d in range(indices.ndim) if d != index_vector_dim]
    return np.moveaxis(indices, index_vector_dim, -1).astype(np.int64), batch_dims


def gather(operand: np.ndarray, indices: np.ndarray, dn, slice_sizes) -> np.ndarray:
    idx, batch_dims = _index_vectors(indices, dn.index_vector_dim)
    batch = idx.shape[:-1]
    nb, rank = len(batch), operand.ndim
    starts = [np.zeros(batch, np.int64) for _ in range(rank)]
    for j, d in enumerate(dn.start_index_map):
        starts[d] = np.clip(idx[..., j], 0, operand.shape[d] - slice_sizes[d])
    for od, idim in zip(dn.operand_batching_dims, dn.start_indices_batching_dims, strict=True):
        starts[od] = np.broadcast_to(_batch_index(batch, batch_dims.index(idim)), batch)
    index = []
    for d in range(rank):
        window = [1] * rank
        window[d] = slice_sizes[d]
        index.append(starts[d].reshape(batch + (1,) * rank)
                     + np.arange(slice_sizes[d]).reshape((1,) * nb + tuple(window)))
    g = operand[tuple(index)] if operand.size else np.zeros(batch + tuple(slice_sizes), operand.dtype)
    dropped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    kept = [slice_sizes[d] for d in range(rank) if d not in dropped]
    g = g.reshape(batch + tuple(kept))
    perm, bi, oi = [], 0, 0
    for o in range(nb + len(kept)):
        if o in dn.offset_dims:
            perm.append(nb + oi)
            oi += 1
        else:
            perm.append(bi)
            bi += 1
    return g.transpose(perm)


@reference(ci.Gather)
def _build_gather(k: ci.Gather, read):
    operand, indices, tid = read(k.operand), read(k.indices), k.out.id

    def run(state):
        # (not ascontiguousarray, which makes a 0-d result 1-d)
        state[tid] = np.asarray(gather(operand(state), indices(state), k.dimension_numbers, k.slice_sizes),
                                order="C")
    return run


def scatter_targets(shape, indices: np.ndarray, update_shape, dn) -> tuple[tuple, np.ndarray, list[int]]:
    """(operand index arrays of every update element, shaped [*scatter,
    *window], whether each element's window is in bounds, and the update
    axes in that order)."""
    idx, batch_dims = _index_vectors(indices, dn.index_vector_dim)
    batch = idx.shape[:-1]
    nb, rank = len(batch), len(shape)
    window_axes = [d for d in range(rank) if d not in dn.inserted_window_dims and d not in dn.input_batching_dims]
    sizes = [1] * rank
    for d, u in zip(window_axes, dn.update_window_dims, strict=True):
        sizes[d] = update_shape[u]
    starts = [np.zeros(batch, np.int64) for _ in range(rank)]
    for j, d in enumerate(dn.scatter_dims_to_operand_dims):
        starts[d] = idx[..., j]
    for od, idim in zip(dn.input_batching_dims, dn.scatter_indices_batching_dims, strict=True):
        starts[od] = np.broadcast_to(_batch_index(batch, batch_dims.index(idim)), batch)
    valid = np.ones(batch, bool)
    for d in range(rank):
        valid &= (starts[d] >= 0) & (starts[d] <= shape[d] - sizes[d])
    index = []
    for d in range(rank):
        window = [1] * rank
        window[d] = sizes[d]
        index.append(starts[d].reshape(batch + (1,) * rank)
                     + np.arange(sizes[d]).reshape((1,) * nb + tuple(window)))
    full = batch + tuple(sizes)
    index = tuple(np.broadcast_to(i, full) for i in index)
    valid = np.broadcast_to(valid.reshape(batch + (1,) * rank), full)
    scatter_axes = [d for d in range(len(update_shape)) if d not in dn.update_window_dims]
    return index, valid, scatter_axes + list(dn.update_window_dims), full


@reference(ci.Scatter)
def _build_scatter(k: ci.Scatter, read):
    operands, indices, updates = [read(v) for v in k.operands], read(k.indices), [read(v) for v in k.updates]
    outs = [t.id for t in k.outs]
    dtypes = [t.dtype for t in k.outs] * 2 + [i.dtype for i in k.body]
    steps = [(instruction(ins, dtypes)[0], ins.args) for ins in k.body]

    def body(args: list) -> list:
        regs = list(args)
        for fn, a in steps:
            regs.append(fn(*[regs[r] for r in a]))
        return [regs[r] for r in k.results]

    # Per operand: written in place (the compiler made its tensor the output).
    in_place = [x.tensor is t for x, t in zip(k.operands, k.outs, strict=True)]
    shapes = [(x.shape, t.shape) for x, t in zip(k.operands, k.outs, strict=True)]

    def operand(state, i):
        target = state[outs[i]] if in_place[i] else None
        if target is not None and target.flags.writeable:
            return target.reshape(shapes[i][0])     # the same memory, unless laid out otherwise
        return np.array(operands[i](state))

    def run(state):
        xs = [operand(state, i) for i in range(len(operands))]
        us = [get(state) for get in updates]
        index, valid, order, full = scatter_targets(xs[0].shape, indices(state), us[0].shape,
                                                    k.dimension_numbers)
        flat_index = tuple(i[valid] for i in index)
        values = [u.transpose(order).reshape(full)[valid] for u in us]
        if k.combiner == "replace":
            for x, v in zip(xs, values, strict=True):
                x[flat_index] = v
        elif k.combiner is not None:
            REDUCE_OPS[k.combiner].at(xs[0], flat_index, values[0])
        else:
            for e in range(len(values[0])):
                at = tuple(i[e] for i in flat_index)
                new = body([x[at] for x in xs] + [v[e] for v in values])
                for x, n in zip(xs, new, strict=True):
                    x[at] = n
        for tid, x, (_, shape) in zip(outs, xs, shapes, strict=True):
            state[tid] = x.reshape(shape)
    return run


def _comparator(k: ci.Sort) -> Callable:
    """less(lhs arrays, rhs arrays) -> bool array, from the body program."""
    return _registers([v.dtype for v in k.inputs], k.body)


def _registers(operand_dtypes: list, body) -> Callable:
    """registers(lhs arrays, rhs arrays) -> the comparator body's registers."""
    dtypes = [d for d in operand_dtypes for _ in range(2)] + [i.dtype for i in body]
    steps = [(instruction(ins, dtypes)[0], ins.args) for ins in body]

    def registers(lhs: list, rhs: list) -> list:
        regs = [x for pair in zip(lhs, rhs, strict=True) for x in pair]
        for fn, a in steps:
            regs.append(fn(*[regs[r] for r in a]))
        return regs
    return registers


def merge_sort(xs: list[np.ndarray], less: Callable) -> np.ndarray:
    """The stable sorting permutation of each row of xs ([rows, n])."""
    rows, n = xs[0].shape
    perm = np.broadcast_to(np.arange(n), (rows, n)).copy()
    r = np.arange(rows)[:, None]
    pos = np.arange(n)
    width = 1
    while width < n:
        cur = [x[r, perm] for x in xs]
        start_left = pos // (2 * width) * 2 * width
        start_right = start_left + width
        len_left = np.minimum(width, n - start_left)
        len_right = np.clip(n - start_right, 0, width)
        in_right = pos >= start_right
        other_start = np.where(in_right, start_left, start_right)
        other_len = np.where(in_right, len_left, len_right)
        lo = np.zeros((rows, n), np.int64)
        hi = np.broadcast_to(other_len, (rows, n)).copy()
        while True:
            active = lo < hi
            if not active.any():
                break
            mid = (lo + hi) // 2
            at = np.minimum(other_start + np.minimum(mid, np.maximum(other_len - 1, 0)), n - 1)
            other = [c[r, at] for c in cur]
            # Left elements go after strictly smaller right ones; right
            # elements after left ones not greater (stability).
            go = np.where(in_right, ~np.asarray(less(cur, other), bool), np.asarray(less(other, cur), bool))
            go = np.broadcast_to(go, active.shape) & active
            lo = np.where(go, mid + 1, lo)
            hi = np.where(active & ~go, mid, hi)
        new_pos = np.where(in_right, pos - width, pos) + lo
        new_perm = np.full_like(perm, -1)
        new_perm[r, new_pos] = perm
        if (new_perm < 0).any():
            # A comparator that is no strict weak order (a FLOAT compare
            # meeting NaNs) may send two elements to one place: the order
            # of the places found, ties by run and position, is still a
            # permutation (XLA's sorts also return one).
            new_perm = np.take_along_axis(perm, np.argsort(new_pos * 2 + in_right, axis=1, kind="stable"),
                                          axis=1)
        perm = new_perm
        width *= 2
    return perm


def _sort_key(key: np.ndarray, descending: bool) -> np.ndarray:
    if is_float(key.dtype):
        key = total_order_key(key)
    key = key.astype(np.int64)
    return -key if descending else key


@reference(ci.Sort)
def _build_sort(k: ci.Sort, read):
    inputs, outs = [read(v) for v in k.inputs], [t.id for t in k.outs]
    registers = _comparator(k)

    def run(state):
        xs = [get(state) for get in inputs]
        if k.key is not None:
            register, descending = k.key
            key = np.broadcast_to(registers(xs, xs)[register], xs[0].shape)
            perm = np.argsort(_sort_key(key, descending), axis=1, kind="stable")
        else:
            perm = merge_sort(xs, lambda lhs, rhs: registers(lhs, rhs)[k.result])
        r = np.arange(xs[0].shape[0])[:, None]
        for tid, x in zip(outs, xs, strict=True):
            state[tid] = x[r, perm]
    return run


def _block_order(xs: list, registers, key: tuple[int, bool], position: np.ndarray, n: int) -> np.ndarray:
    """Unique int64 sort keys of elements: (key, position in the row), with
    positions >= n (padding) after every element. The keys are at most 32
    bits (the compiler checks), shifted to [0, 2**33); positions take the
    low bits."""
    register, descending = key
    k = np.broadcast_to(registers(xs, xs)[register], xs[0].shape)
    k = _sort_key(k, descending) + (1 << 32)
    k = np.where(position >= n, 1 << 33, k)
    bits = max(int(position.max(initial=0)).bit_length(), 1)
    return (k << bits) | position


@reference(ci.BlockSort)
def _build_block_sort(k: ci.BlockSort, read):
    inputs, outs, index = [read(v) for v in k.inputs], [t.id for t in k.outs], k.index.id
    registers = _registers([v.dtype for v in k.inputs], k.body)
    rows, n = k.inputs[0].shape
    width = k.blocks * k.block

    def run(state):
        padded = []
        for get in inputs:
            x = np.zeros((rows, width), k.inputs[len(padded)].dtype)
            x[:, :n] = get(state)
            padded.append(x)
        position = np.broadcast_to(np.arange(width, dtype=np.int64), (rows, width))
        order = _block_order(padded, registers, k.key, position, n).reshape(rows * k.blocks, k.block)
        perm = np.argsort(order, axis=1)          # the keys are unique: any sort
        for tid, x in zip(outs, padded, strict=True):
            state[tid] = np.take_along_axis(x.reshape(order.shape), perm, axis=1).reshape(rows, width)
        state[index] = np.take_along_axis(position.reshape(order.shape), perm, axis=1).astype(np.int32).reshape(
            rows, width)
    return run


@reference(ci.MergeSplit)
def _build_merge_split(k: ci.MergeSplit, read):
    sources, targets, s = [t.id for t in k.sources], [t.id for t in k.targets], k.block
    registers = _registers([t.dtype for t in k.sources[:-1]], k.body)
    lo, hi = np.array(k.lo), np.array(k.hi)
    rows, width = k.sources[0].shape

    def run(state):
        blocks = [state[t].reshape(rows, width // s, s) for t in sources]
        pairs = [np.concatenate([x[:, lo], x[:, hi]], axis=2) for x in blocks]
        order = _block_order(pairs[:-1], registers, k.key, pairs[-1].astype(np.int64), k.n)
        perm = np.argsort(order, axis=2, kind="stable")     # two sorted runs: one merge
        for tid, x, both in zip(targets, blocks, pairs, strict=True):
            merged = np.take_along_axis(both, perm, axis=2)
            out = x.copy()
            out[:, lo], out[:, hi] = merged[..., :s], merged[..., s:]
            state[tid] = out.reshape(rows, width)
    return run


@reference(ci.TopK)
def _build_top_k(k: ci.TopK, read):
    get, values, indices, count = read(k.input), k.values.id, k.indices.id, k.values.shape[1]

    def run(state):
        x = get(state)
        perm = np.argsort(_sort_key(x, True), axis=1, kind="stable")[:, :count]
        state[values] = np.take_along_axis(x, perm, axis=1)
        state[indices] = perm.astype(np.int32)
    return run
