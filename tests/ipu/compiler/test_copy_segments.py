"""A Copy of a view that reads its tensor in contiguous segments (padding,
pooling windows, weight reversals, select_and_scatter's strided spreads,
slices and transposes that keep the last axis whole) is costed per
segment, not per element: the counts agree exactly with counting every
element, for random shapes, windows, strides, paddings, dilations,
reversals and tile mappings (runs shorter and longer than a segment)."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_ipu.compiler import cost
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.programs import Copy
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View, source_tiles, window_outputs
from jax_ipu.targets import get_target

TILES = 8


def _mapping(draw, size: int) -> TileMapping:
    cuts = sorted(set(draw(st.lists(st.integers(1, max(size - 1, 1)), max_size=30)))) if size > 1 else []
    starts = np.array([0, *cuts], np.int64)
    tiles = draw(st.lists(st.integers(0, TILES - 1), min_size=len(starts), max_size=len(starts)))
    return TileMapping.from_runs(size, np.array(tiles), starts)


def _spec(draw, n: int, last: bool, atom: int):
    """One axis's windows spec: any, or on the last axis one that keeps
    segments of `atom` whole (window 1 padded by whole atoms, or a window
    of whole atoms), or not quite."""
    if last and draw(st.booleans()):
        lo, hi = draw(st.integers(-1, 2)) * atom, draw(st.integers(-1, 2)) * atom
        if n + lo + hi <= 0:
            lo = hi = 0
        if draw(st.booleans()):
            return (1, 1, lo, hi, 1, 1, 0)
        windows = (n + lo + hi) // atom
        w = draw(st.integers(1, max(windows, 1))) * atom
        return (w, draw(st.sampled_from([atom, 2 * atom, 1])), lo, hi, 1, 1, draw(st.sampled_from([0, 0, 1])))
    return (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(-1, 2)), draw(st.integers(-1, 2)),
            draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([0, 0, 1])))


@st.composite
def views(draw):
    atom = draw(st.sampled_from([1, 2, 4, 6]))
    rank = draw(st.integers(1, 3))
    shape = (*(draw(st.integers(1, 4)) for _ in range(rank - 1)), atom * draw(st.integers(1, 5)))
    t = Tensor(0, "x", shape, np.dtype(np.float16), _mapping(draw, math.prod(shape)))
    view = View(t)
    kind = draw(st.sampled_from(["windows", "pool", "spread", "slice", "transpose", "reshape"]))
    fill = np.float16(0)
    if kind in ("windows", "pool"):
        spec = tuple(_spec(draw, n, d == rank - 1, atom) for d, n in enumerate(shape))
        if not all(window_outputs(shape, spec)):
            spec = tuple((1, 1, 0, 0, 1, 1, 0) for _ in shape)
        view = view.then("windows", spec, fill)
        outs, window = math.prod(view.shape[:rank]), math.prod(view.shape[rank:])
        if kind == "pool":      # reduce_window's [outputs, window], maybe window-major
            view = view.then("reshape", (outs, window))
            if draw(st.booleans()):
                view = view.then("transpose", (1, 0))
        else:     # pad and reverse: window 1, or each axis's whole
            view = view.then("reshape", tuple(view.shape[:rank]) if window == 1 else (outs, window))
    elif kind == "spread":      # select_and_scatter's source spread over each stride, then shifted
        valid = [draw(st.integers(1, 2)) for _ in shape[:-1]] + [1]
        strides = [v + draw(st.integers(0, 1)) for v in valid[:-1]] + [1]
        view = view.then("reshape", tuple(d for n in shape for d in (n, 1)))
        view = view.then("broadcast", tuple(d for n, v in zip(shape, valid, strict=True) for d in (n, v)),
                         tuple(range(2 * rank)))
        view = view.then("windows", tuple(sp for v, s in zip(valid, strides, strict=True)
                                          for sp in ((1, 1, 0, 0, 1, 1, 0), (1, 1, 0, s - v, 1, 1, 0))), fill)
        repeated = tuple(n * s for n, s in zip(shape, strides, strict=True))
        view = view.then("reshape", repeated)
        shift = [draw(st.integers(-1, 2)) for _ in shape[:-1]] + [0]
        view = view.then("windows", tuple((1, 1, sh, int(d < rank - 1), 1, 1, 0) for d, sh in enumerate(shift)), fill)
        view = view.then("reshape", view.shape[:rank])
    elif kind == "slice":
        starts = [draw(st.integers(0, n - 1)) for n in shape]
        limits = [draw(st.integers(s + 1, n)) for s, n in zip(starts, shape, strict=True)]
        steps = [draw(st.integers(1, 2)) for _ in shape]
        view = view.then("slice", tuple(starts), tuple(limits), tuple(steps))
    elif kind == "transpose":
        view = view.then("reshape", (1, *shape))
        view = view.then("transpose", tuple(int(a) for a in draw(st.permutations(range(rank + 1)))))
    else:
        view = view.then("reshape", (*shape[:-1], 1, shape[-1], 1)).then("reshape", (math.prod(shape),))
    dst = Tensor(1, "y", view.shape, np.dtype(np.float16), _mapping(draw, view.size))
    return view, dst


def _per_element(view, dst):
    owners, readers = source_tiles(view).astype(np.int64), dst.mapping.element_tiles().astype(np.int64)
    return (np.bincount(readers[owners == readers], minlength=TILES),
            np.bincount(owners, minlength=TILES))


@settings(max_examples=200, deadline=None)
@given(views())
def test_segments_count_as_every_element(case):
    view, dst = case
    if not view.size:
        return
    want = _per_element(view, dst)
    shape = view.tensor.shape
    for atom in range(1, shape[-1] + 1):
        if shape[-1] % atom:
            continue
        segments = cost._segments(view, atom)
        if segments is None:
            continue
        local, read = cost._kept_by_segments(dst.mapping, view.tensor.mapping, *segments, TILES)
        np.testing.assert_array_equal(local, want[0])
        np.testing.assert_array_equal(read, want[1])
    # And the whole copy's cost, whichever way it is counted.
    target = get_target("ipu2", num_tiles=TILES)
    step = Copy(view, dst)
    received = cost.cost_copy(target, step)
    local, read = want[0] * 2, want[1] * 2
    sent = np.minimum(read - local, view.tensor.mapping.elements_per_tile(TILES) * 2)
    np.testing.assert_array_equal(received, dst.mapping.elements_per_tile(TILES) * 2 - local)
    assert step.exchange_cycles == cost.exchange_cycles(target, sent, received) + \
        -(-int(local.max(initial=0)) // target.sram_write_bytes_per_cycle)


def test_pooling_windows_and_padding_are_counted_by_segments():
    """The views a max pool and a padded convolution copy, channels
    innermost, are counted by segments of channels (not per element)."""
    t = Tensor(0, "x", (2, 9, 9, 32), np.dtype(np.float16), TileMapping.linear(2 * 9 * 9 * 32, TILES))
    pad = View(t).then("windows", ((1, 1, 0, 0, 1, 1, 0), (1, 1, 1, 1, 1, 1, 0), (1, 1, 1, 1, 1, 1, 0),
                                   (1, 1, 0, 0, 1, 1, 0)), np.float16(0)).then("reshape", (2, 11, 11, 32))
    pool = View(t).then("windows", ((1, 1, 0, 0, 1, 1, 0), (3, 2, 1, 1, 1, 1, 0), (3, 2, 1, 1, 1, 1, 0),
                                    (1, 1, 0, 0, 1, 1, 0)), np.float16(0))
    pool = pool.then("reshape", (2 * 5 * 5 * 32, 9)).then("transpose", (1, 0))
    for view in (pad, pool):
        dst = Tensor(1, "y", view.shape, np.dtype(np.float16), TileMapping.linear(view.size, TILES))
        atom, stride, first, _ = cost._copy_segments(view, dst.mapping)
        assert 32 % atom == 0 and atom >= cost.MIN_SEGMENT and stride == 1 and len(first) == view.size // atom
        local, read = cost._kept_by_segments(dst.mapping, t.mapping, atom, stride, first, _, TILES)
        want = _per_element(view, dst)
        np.testing.assert_array_equal(local, want[0])
        np.testing.assert_array_equal(read, want[1])
