"""Broadcasts that only element-wise ops read (a bias, a row's mean or
maximum, an attention mask) stay unmaterialised: the fused vertices read
the source elements their part of the result needs, as Poplar's
element-wise vertices read a broadcast view. Checked: the numbers against
XLA:CPU, no Copy made for them, each vertex's read regions against the
source elements worked out one by one, and the exchange the estimate
charges against those regions."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn
from jax_ipu.compiler.builder import broadcast_reads
from jax_ipu.graph.compute import VertexArray
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.programs import Copy, Execute, leaves
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View


def _copies(program) -> list:
    return [s for s in leaves(program.body) if isinstance(s, Copy)]


def _broadcast_copies(program) -> list:
    return [s for s in _copies(program) if any(op[0] == "broadcast" for part in getattr(s.src, "parts", [s.src])
                                                 for op in part.ops)]


def _layer_norm_and_softmax(x, gamma, beta):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    y = (x - m) * lax.rsqrt(v + 1e-5) * gamma + beta
    z = jnp.exp(y - y.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def test_normalisation_reads_broadcasts_in_place():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6, 40)).astype(np.float32)
    gamma, beta = rng.standard_normal(40).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    assert_matches_cpu(_layer_norm_and_softmax, x, gamma, beta, rtol=1e-5, atol=1e-6)
    program = compile_fn(_layer_norm_and_softmax, x, gamma, beta)
    # Every broadcast here feeds element-wise ops only: none is copied.
    assert _broadcast_copies(program) == []


def test_broadcast_read_outside_element_wise_ops_is_materialised():
    def f(x, b):
        return (jnp.broadcast_to(b, x.shape) @ x.T) + x.sum()
    rng = np.random.default_rng(1)
    x, b = rng.standard_normal((8, 12)).astype(np.float32), rng.standard_normal(12).astype(np.float32)
    assert_matches_cpu(f, x, b, rtol=1e-5, atol=1e-5)
    assert len(_broadcast_copies(compile_fn(f, x, b))) == 1


@pytest.mark.parametrize("shapes", [((3,), (0,)), ((0,), (5,)), ((0,), (0,))])
def test_broadcasts_into_an_empty_result(shapes):
    """jnp.outer with a length-0 vector: the broadcast operands of an empty
    product have no elements to read (the JAX suite's linalg testOuter)."""
    a, b = (np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) for s in shapes)
    got = assert_matches_cpu(jnp.outer, a, b, exact=True)
    assert got.shape == (a.size, b.size)


def test_broadcast_in_a_loop_body_and_as_a_result():
    def f(x, b):
        bb = jnp.broadcast_to(b[:, None], x.shape)

        def body(i, acc):
            return acc * 0.5 + bb * x
        return lax.fori_loop(0, 3, body, x), bb
    rng = np.random.default_rng(2)
    x, b = rng.standard_normal((6, 10)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    assert_matches_cpu(f, x, b, rtol=1e-6, atol=1e-6)


def _reference_reads(shape_src, shape, dims, intervals, offsets):
    """Per vertex, the sorted source elements its output intervals read."""
    index = np.broadcast_to(np.arange(int(np.prod(shape_src))).reshape(
        [shape_src[list(dims).index(a)] if a in dims else 1 for a in range(len(shape))]), shape).ravel()
    return [np.unique(np.concatenate([index[s:e] for s, e in intervals[offsets[v]:offsets[v + 1]]]
                                     or [np.zeros(0, np.int64)]))
            for v in range(len(offsets) - 1)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_read_regions_match_the_elements_each_vertex_needs(shape, data):
    shape = tuple(shape)
    rank = len(shape)
    dims = tuple(sorted(data.draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))))
    src_shape = tuple(data.draw(st.sampled_from([1, shape[a]])) for a in dims)
    size = int(np.prod(shape))
    src = Tensor(0, "src", src_shape, np.dtype(np.float32),
                 TileMapping.linear(int(np.prod(src_shape)), 3))
    view = View(src).then("broadcast", shape, dims)
    # Output intervals of a few vertices, as a mapping over tiles gives them.
    tiles = data.draw(st.integers(1, 5))
    out = TileMapping.linear(size, tiles, min_elements_per_tile=data.draw(st.integers(1, 7)))
    order = np.argsort(out.tiles, kind="stable")
    intervals = np.stack([out.starts[order], out.stops[order]], axis=1)
    offsets = np.r_[0, np.cumsum(np.bincount(out.tiles, minlength=tiles))]
    got, got_offsets = broadcast_reads(view, intervals, offsets)
    want = _reference_reads(src_shape, shape, dims, intervals, offsets)
    assert got_offsets.shape == (len(offsets) - 1, 2)
    for v in range(len(offsets) - 1):
        mine = got[got_offsets[v, 0]:got_offsets[v, 1]]
        assert np.all(mine[:, 0] < mine[:, 1])
        assert np.all(mine[1:, 0] > mine[:-1, 1])       # sorted, disjoint, not touching
        elements = np.concatenate([np.arange(s, e) for s, e in mine] or [np.zeros(0, np.int64)])
        np.testing.assert_array_equal(elements, want[v])


def test_exchange_charged_for_a_bias_read_by_every_tile():
    """A bias of 64 float32 on one tile, read by each of 16 tiles' vertices of
    [16, 64] + bias: every other tile receives the whole bias."""
    x = np.zeros((64, 64), np.float32)
    b = np.zeros(64, np.float32)
    program = compile_fn(lambda x, b: x + b, x, b)
    steps = [s for s in leaves(program.body) if isinstance(s, Execute)]
    assert len(steps) == 1 and _copies(program) == []
    vertices = steps[0].compute_set.vertices
    assert isinstance(vertices, VertexArray)
    bias = next(t for t in program.tensors if t.shape == (64,))
    holders = set(bias.mapping.tiles.tolist())
    readers = [int(t) for t in vertices.tiles]
    expected = sum(bias.size * 4 - 4 * int(bias.mapping.elements_per_tile(SMALL.num_tiles)[t]) for t in readers)
    assert steps[0].exchange_bytes == expected
    assert expected > 0 and len(holders) < len(readers)
