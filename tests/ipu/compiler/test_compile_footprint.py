"""What a compiled program keeps in host memory: the compiler's per-element
caches are dropped once the program is built, and a gather view (im2col
patches, windows, pads) keeps one int32 index array, padding included, instead
of an array, a padding-free copy and a mask (a ResNet-18 CIFAR step at
batch 32 held 8.7 GB after compiling; benchmarks/compile_footprint.py)."""
from __future__ import annotations

import numpy as np
import pytest
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn
from jax_ipu.graph import programs as p
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View, source_tiles

RNG = np.random.default_rng(7)


def conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def test_compiled_program_keeps_no_per_element_tile_caches():
    x = RNG.standard_normal((2, 9, 9, 3)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32)
    program = compile_fn(conv, x, w)
    assert all(t.mapping._element_tiles is None and t.mapping._by_tile is None for t in program.tensors)
    # Rebuilt on demand, in the smallest type that holds the tile numbers.
    tiles = program.tensors[0].mapping.element_tiles()
    assert tiles.dtype == np.uint16 and len(tiles) == program.tensors[0].size


def test_element_tiles_take_a_wider_type_past_65535_tiles():
    mapping = TileMapping(4, [3, 70000], [0, 2], [2, 4])
    assert mapping.element_tiles().tolist() == [3, 3, 70000, 70000]
    assert TileMapping.from_element_tiles(np.array([1, 1, 2])).element_tiles().dtype == np.uint16


def test_padded_patches_are_a_windows_pattern_not_an_index_per_element(monkeypatch):
    """The im2col fallback's patches (planned convolutions make none: the
    fallback is forced here) are a windows view op, not a gather."""
    from jax_ipu.compiler.lowering import conv as conv_lowering
    monkeypatch.setattr(conv_lowering, "MAX_AXIS_PAIRS", 4)
    x = RNG.standard_normal((2, 9, 9, 3)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32)
    program = compile_fn(conv, x, w)
    ops = [op for s in p.leaves(program.body) if isinstance(s, p.Copy)
           for v in ([s.src] if hasattr(s.src, "ops") else s.src.parts) for op in v.ops]
    assert not [op for op in ops if op[0] == "gather"]
    (windows,) = [op for op in ops if op[0] == "windows"]
    spec, fill = windows[1], windows[2]
    assert spec == ((3, 1, 1, 1, 1, 1, 0),) * 2 and fill == 0      # SAME: one element of padding each side
    assert_matches_cpu(conv, x, w, rtol=1e-5, atol=1e-5, target=SMALL)


@pytest.mark.parametrize("fill", [np.float32(-2.5), None])
def test_gather_view_values_and_costed_sources(fill):
    t = Tensor(0, "t", (2, 3), np.dtype(np.float32), TileMapping.linear(6, 2))
    indices = np.array([[5, -1, 0], [2, 2, -1]]) if fill is not None else np.array([[5, 1, 0], [2, 2, 4]])
    view = View(t).then("gather", indices, fill)
    _, stored, kept_fill = view.ops[0]
    assert stored.dtype == np.int32 and (kept_fill is None) == (fill is None)
    data = np.arange(6, dtype=np.float32).reshape(2, 3) * 10
    want = np.where(indices < 0, fill if fill is not None else 0, data.reshape(-1)[np.maximum(indices, 0)])
    np.testing.assert_array_equal(view.apply(lambda _: data), want)
    # The exchange cost reads padding as the tensor's last element.
    # (elements 0-2 on tile 0, 3-5 on tile 1)
    np.testing.assert_array_equal(source_tiles(view), np.where(indices < 0, 5, indices).ravel() // 3)


def test_gather_with_padding_and_no_fill_is_refused():
    t = Tensor(0, "t", (4,), np.dtype(np.float32), TileMapping.linear(4, 1))
    with pytest.raises(ValueError, match="fill"):
        View(t).then("gather", np.array([0, -1]), None)


def test_strided_dilated_padded_conv_matches_cpu_after_the_change():
    x = RNG.standard_normal((3, 11, 10, 5)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 5, 6)).astype(np.float32)

    def f(x, w):
        return lax.conv_general_dilated(x, w, (2, 1), ((2, 1), (0, 3)), lhs_dilation=(1, 2), rhs_dilation=(2, 1),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert_matches_cpu(f, x, w, target=SMALL, rtol=1e-5, atol=1e-5)


def test_outer_reduction_reads_whole_rows_once_and_values_match():
    # Batch norm's statistics: a sum over all but the channels. Each tile
    # reduces a run of whole rows: one interval per vertex, the vertices
    # together reading every input element once (a vertex per output and
    # chunk read a one-element interval from every row: 92M intervals in a
    # ResNet-50 step).
    x = RNG.standard_normal((4, 9, 9, 32)).astype(np.float32)

    def stats(x):
        return x.sum((0, 1, 2)), (x * x).mean((0, 1, 2))
    program = compile_fn(stats, x)
    from jax_ipu.graph.programs import Execute
    partial_vertices = [v for s in program.body.steps if isinstance(s, Execute)
                        for v in s.compute_set.vertices if v.codelet.startswith("ReducePartial<add")]
    assert len(partial_vertices) > 1
    for tensor_reads in ([v.reads[0].intervals for v in partial_vertices[:len(partial_vertices) // 2]],
                         [v.reads[0].intervals for v in partial_vertices[len(partial_vertices) // 2:]]):
        assert all(len(r) == 1 for r in tensor_reads)
        covered = np.sort(np.concatenate(tensor_reads), axis=0)
        assert covered[0, 0] == 0 and covered[-1, 1] == x.size and (covered[1:, 0] == covered[:-1, 1]).all()
    assert_matches_cpu(stats, x, rtol=1e-5, atol=1e-4, target=SMALL)


@pytest.mark.parametrize("chunk", [1, 4, 5, 1 << 18])
def test_gather_in_chunks_matches_numpy(monkeypatch, chunk):
    from jax_ipu.graph import views
    monkeypatch.setattr(views, "GATHER_CHUNK", chunk)
    t = Tensor(0, "t", (3, 7), np.dtype(np.int16), TileMapping.linear(21, 3))
    indices = RNG.integers(-1, 21, (4, 6))
    view = View(t).then("transpose", (1, 0)).then("gather", indices, np.int16(-9))
    data = RNG.integers(-1000, 1000, (3, 7)).astype(np.int16)
    flat = data.T.reshape(-1)
    want = np.where(indices < 0, -9, flat[np.maximum(indices, 0)]).astype(np.int16)
    got = view.apply(lambda _: data)
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, want)

