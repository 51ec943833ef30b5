"""The "windows" view op (graph.views): sliding windows over trailing axes
as a pattern (window, stride, padding, base and window dilation, reversal)
instead of an index per element. Checked element by element against the
StableHLO definition written out directly, and through convolutions of
random configurations against XLA:CPU."""
from __future__ import annotations

import itertools

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from helpers import SMALL, assert_matches_cpu
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View, source_tiles, window_outputs

axis_spec = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(-2, 3), st.integers(-2, 3),
                      st.integers(1, 3), st.integers(1, 3), st.integers(0, 1))


def reference(a: np.ndarray, spec, fill) -> np.ndarray:
    """out[..., o, w] = a[..., i] where o * stride + w' * dilation - low = i * base
    (w' = window - 1 - w when reversed), else fill."""
    rank = len(spec)
    lead, sizes = a.shape[:a.ndim - rank], a.shape[a.ndim - rank:]
    outs = window_outputs(sizes, spec)
    windows = tuple(s[0] for s in spec)
    out = np.full(lead + outs + windows, fill, a.dtype)
    for pos in itertools.product(*map(range, outs + windows)):
        o, w = pos[:rank], pos[rank:]
        index = []
        for d, (window, stride, low, _, base, dilation, reverse) in enumerate(spec):
            q = o[d] * stride + ((window - 1 - w[d]) if reverse else w[d]) * dilation - low
            if q < 0 or q % base or q // base >= sizes[d]:
                break
            index.append(q // base)
        else:
            out[(Ellipsis, *pos)] = a[(Ellipsis, *index)]
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(axis_spec, min_size=1, max_size=2), st.lists(st.integers(0, 6), min_size=2, max_size=2),
       st.integers(0, 2), st.integers(0, 2**31))
def test_windows_view_matches_the_definition(spec, sizes, lead, seed):
    spec = tuple(spec)
    sizes = tuple(sizes[:len(spec)])
    shape = (2,) * lead + sizes
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    t = Tensor(0, "x", shape, np.dtype(np.float32), TileMapping.linear(a.size, 3))
    view = View(t).then("windows", spec, np.float32(-7.0))
    got = view.apply(lambda _: a)
    assert view.shape == got.shape
    np.testing.assert_array_equal(got, reference(a, spec, np.float32(-7.0)))
    # The exchange cost reads the same pattern over the tensor's tiles (padding
    # charged to the last element's tile).
    tiles = t.mapping.element_tiles()
    want_tiles = reference(tiles.reshape(shape), spec, tiles[-1] if a.size else 0).ravel()
    np.testing.assert_array_equal(source_tiles(view), want_tiles)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.integers(0, 2**31), st.sampled_from(["NHWC", "NCHW"]),
       st.sampled_from([1, 2]), st.booleans())
def test_random_convolutions_match_cpu(spatial, seed, layout, groups, batch_groups):
    rng = np.random.default_rng(seed)
    sizes = tuple(int(n) for n in rng.integers(3, 8, spatial))
    window = tuple(int(n) for n in rng.integers(1, 4, spatial))
    strides = tuple(int(n) for n in rng.integers(1, 3, spatial))
    padding = tuple((int(lo), int(hi)) for lo, hi in rng.integers(-1, 3, (spatial, 2)))
    lhs_dilation = tuple(int(n) for n in rng.integers(1, 3, spatial))
    rhs_dilation = tuple(int(n) for n in rng.integers(1, 3, spatial))
    cg, og = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    batch = 2 * groups if batch_groups else 2
    features = cg if batch_groups else cg * groups
    spatial_names = "HW"[:spatial] if spatial == 2 else "W"
    if layout == "NHWC":
        lhs_spec, out_spec = "N" + spatial_names + "C", "N" + spatial_names + "C"
        lhs_shape = (batch, *sizes, features)
    else:
        lhs_spec, out_spec = "NC" + spatial_names, "NC" + spatial_names
        lhs_shape = (batch, features, *sizes)
    rhs_shape = (*window, cg, og * groups)
    lhs = rng.standard_normal(lhs_shape).astype(np.float32)
    rhs = rng.standard_normal(rhs_shape).astype(np.float32)
    kwargs = dict(window_strides=strides, padding=padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                  dimension_numbers=(lhs_spec, spatial_names + "IO", out_spec),
                  feature_group_count=1 if batch_groups else groups,
                  batch_group_count=groups if batch_groups else 1)
    try:
        jax.eval_shape(lambda x, w: lax.conv_general_dilated(x, w, **kwargs), lhs, rhs)
    except (TypeError, ValueError):
        return          # a configuration JAX refuses (e.g. an empty output)
    assert_matches_cpu(lambda x, w: lax.conv_general_dilated(x, w, **kwargs), lhs, rhs,
                       rtol=1e-5, atol=1e-5, scaled=True, target=SMALL)


def test_reverse_is_one_window_per_axis_and_matches_cpu():
    # reverse: a window the size of each axis, reversed on the reversed
    # axes (no index per element); exact on integers.
    x = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
    for dims in [(0,), (1,), (2,), (0, 2), (0, 1, 2)]:
        assert_matches_cpu(lambda a, dims=dims: lax.rev(a, dims), x, target=SMALL)
