"""stablehlo.convolution on the ipu device against JAX's CPU backend:
dimension numbers, strides, padding, lhs/rhs dilation, feature and batch
groups, f32 and f16 (f32 accumulation), conv_transpose and gradients.

Tolerances: f32 rtol/atol 1e-5 (the planned matmul sums K-chunks in
another order than XLA:CPU's), f16 2e-2 relative to the output's scale."""
from __future__ import annotations

import logging
import re

import jax
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu, on_cpu, run_ipu

F16_TOL = 2e-2


def rand(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


NHWC = ("NHWC", "HWIO", "NHWC")
CASES = {
    # name: (lhs shape, rhs shape, kwargs)
    "nhwc-same": ((2, 8, 8, 3), (3, 3, 3, 4), dict(window_strides=(1, 1), padding="SAME",
                                                   dimension_numbers=NHWC)),
    "nhwc-valid-stride2": ((2, 9, 7, 3), (3, 2, 3, 5), dict(window_strides=(2, 2), padding="VALID",
                                                            dimension_numbers=NHWC)),
    "nchw-explicit-pad": ((2, 3, 7, 6), (4, 3, 3, 3), dict(window_strides=(1, 2), padding=((1, 2), (0, 1)),
                                                           dimension_numbers=("NCHW", "OIHW", "NCHW"))),
    "negative-pad": ((1, 9, 9, 2), (2, 2, 2, 3), dict(window_strides=(1, 1), padding=((-1, 1), (2, -2)),
                                                      dimension_numbers=NHWC)),
    "lhs-dilation": ((2, 5, 6, 3), (3, 3, 3, 2), dict(window_strides=(1, 1), padding=((2, 2), (1, 1)),
                                                      lhs_dilation=(2, 3), dimension_numbers=NHWC)),
    "rhs-dilation": ((1, 10, 9, 2), (3, 2, 2, 4), dict(window_strides=(2, 1), padding="SAME",
                                                       rhs_dilation=(2, 3), dimension_numbers=NHWC)),
    "feature-groups": ((2, 6, 6, 4), (3, 3, 2, 6), dict(window_strides=(1, 1), padding="SAME",
                                                        feature_group_count=2, dimension_numbers=NHWC)),
    "depthwise": ((2, 6, 6, 4), (3, 3, 1, 8), dict(window_strides=(1, 1), padding="SAME",
                                                   feature_group_count=4, dimension_numbers=NHWC)),
    "batch-groups": ((4, 6, 5, 3), (2, 2, 3, 6), dict(window_strides=(1, 1), padding="VALID",
                                                      batch_group_count=2, dimension_numbers=NHWC)),
    "1d-nwc": ((3, 17, 4), (5, 4, 6), dict(window_strides=(3,), padding="SAME",
                                           dimension_numbers=("NWC", "WIO", "NWC"))),
    "3d": ((1, 5, 4, 6, 2), (2, 3, 2, 2, 3), dict(window_strides=(1, 1, 2), padding="SAME",
                                                  dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))),
    "odd-layout": ((5, 2, 6, 3), (3, 2, 4, 3), dict(window_strides=(1, 1), padding="VALID",
                                                    dimension_numbers=("HNWC", "OHWI", "CWNH"))),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"stablehlo.convolution-{c}")
def test_conv_general_dilated(case, dtype):
    lhs, rhs, kwargs = CASES[case]
    # float16 within F16_TOL of the output's scale, float32 within 1e-5.
    tol = dict(rtol=0, atol=F16_TOL, scaled=True) if dtype == np.float16 else dict(rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x, w: lax.conv_general_dilated(x, w, **kwargs), rand(lhs, dtype, 0), rand(rhs, dtype, 1),
                       **tol)


def test_conv_preferred_element_type():
    x, w = rand((2, 6, 6, 3), np.float16, 0), rand((3, 3, 3, 4), np.float16, 1)
    assert_matches_cpu(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC,
                                                             preferred_element_type=np.float32), x, w,
                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("strides,padding", [((2, 2), "SAME"), ((1, 1), "VALID"), ((3, 2), ((1, 2), (0, 1)))],
                         ids=lambda p: str(p).replace(" ", ""))
def test_conv_transpose(strides, padding):
    x, w = rand((2, 5, 6, 3), np.float32, 0), rand((3, 3, 3, 4), np.float32, 1)
    assert_matches_cpu(lambda x, w: lax.conv_transpose(x, w, strides, padding, dimension_numbers=NHWC), x, w,
                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("groups", [1, 3], ids=lambda g: f"stablehlo.convolution-grad-groups{g}")
def test_conv_gradients(groups):
    """jax.grad of a strided conv: the input gradient is an lhs-dilated conv
    of the reversed kernel, the kernel gradient a batch-grouped conv."""
    x, w = rand((2, 7, 8, 6), np.float32, 0), rand((3, 3, 6 // groups, 6), np.float32, 1)

    def loss(x, w):
        y = lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=NHWC, feature_group_count=groups)
        return (y * y).sum()
    assert_matches_cpu(jax.grad(loss, argnums=(0, 1)), x, w, rtol=1e-4, atol=1e-4)


def test_flax_style_cnn_training_step():
    """Conv -> relu -> conv -> mean, with the parameter update, as a Flax
    NHWC/HWIO model trains."""
    params = (rand((3, 3, 1, 8), np.float32, 1) * 0.3, rand((3, 3, 8, 4), np.float32, 2) * 0.3)
    x = rand((4, 10, 10, 1), np.float32, 0)

    def loss(params, x):
        w1, w2 = params
        h = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=NHWC))
        y = lax.conv_general_dilated(h, w2, (2, 2), "SAME", dimension_numbers=NHWC)
        return (y ** 2).mean()

    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    assert_matches_cpu(step, params, x, rtol=1e-4, atol=1e-4)


def test_empty_input_padded_to_a_nonempty_output_and_its_gradients():
    """An input with a 0-sized spatial dimension, padded to a non-empty
    output (all zeros), with batch groups; both gradients (one of them a
    convolution reading an empty operand)."""
    conv = lambda lhs, rhs: lax.conv_general_dilated(  # noqa: E731
        lhs, rhs, window_strides=(1, 2), padding=((1, 0), (0, 1)), rhs_dilation=(2, 2),
        dimension_numbers=("NHWC", "OIHW", "NCHW"), batch_group_count=2)
    lhs, rhs = rand((2, 0, 4, 1), np.float32, 0), rand((4, 1, 1, 2), np.float32, 1)
    ct = rand((1, 4, 1, 2), np.float32, 2)
    assert_matches_cpu(lambda l, r, c: (conv(l, r), *jax.vjp(conv, l, r)[1](c)), lhs, rhs, ct, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shapes", [((3, 3), (3, 3)), ((2, 3, 7), (4, 3, 3))], ids=["0d", "1d"])
def test_boolean_convolution_is_an_or_of_ands(shapes):
    rng = np.random.default_rng(3)
    lhs, rhs = (rng.random(s) < 0.3 for s in shapes)
    conv = lambda l, r: lax.conv_general_dilated(l, r, (1,) * (l.ndim - 2), "VALID")  # noqa: E731
    ipu = jax.devices("ipu")[0]
    got = np.asarray(jax.jit(conv)(*jax.device_put((lhs, rhs), ipu)))
    want = np.asarray(jax.jit(conv)(*jax.device_put((lhs, rhs), jax.devices("cpu")[0])))
    assert got.dtype == want.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


def _compiled(f, *args):
    from helpers import compile_fn
    return compile_fn(f, *args)


def _copied_shapes(program) -> list[tuple]:
    """The shapes of the tensors the compiled program's Copies write."""
    from jax_ipu.graph import programs as p
    return [tuple(s.dst.shape) for s in p.leaves(program.body) if isinstance(s, p.Copy)]


def _compute_sets(program) -> list:
    from jax_ipu.graph import programs as p
    return [s.compute_set for s in p.leaves(program.body) if isinstance(s, p.Execute)]


def _conv_steps(program) -> list:
    """The planned convolutions' ConvPartials compute sets."""
    from jax_ipu.graph.codelets_conv import ConvPartials
    return [cs for cs in _compute_sets(program) if isinstance(cs.kernel, ConvPartials)]


def test_planned_3x3_convolution_copies_no_patch_matrix():
    """A 3x3 NHWC x HWIO convolution and its two gradients: no Copy of
    window x input size (no patch matrix), no im2col compute set, every
    product a ConvPartials compute set; the forward convolution copies
    nothing (input and kernel read in place); the values match XLA:CPU."""
    x, w = rand((2, 6, 6, 4), np.float32, 0), rand((3, 3, 4, 5), np.float32, 1)
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)  # noqa: E731
    grads = jax.grad(lambda x, w: (conv(x, w) ** 2).sum(), argnums=(0, 1))
    for f, convs in ((conv, 1), (grads, 3)):
        program = _compiled(f, x, w)
        sizes = [int(np.prod(s)) for s in _copied_shapes(program)]
        assert all(size < 9 * x.size for size in sizes), sizes
        assert f is not conv or sizes == []
        names = [cs.name for cs in _compute_sets(program)]
        assert not any("im2col" in n for n in names), names
        assert len(_conv_steps(program)) == convs
        assert_matches_cpu(f, x, w, rtol=1e-4, atol=1e-4)


def _splits(name: str) -> list[int]:
    """A ConvPartials compute set's splits (groups, batch, each output
    dimension, input channels, output channels, each kernel dimension)."""
    return [int(s) for s in re.search(r" ([0-9x]+) tiles", name).group(1).split("x")]


@pytest.mark.parametrize("shape,strides", [((2, 16, 16, 8), (1, 1)), ((1, 15, 17, 3), (2, 2))],
                         ids=["16x16-stride1", "15x17-stride2"])
def test_each_tile_receives_its_input_region_once_plus_halo(shape, strides):
    """In a 3x3 convolution's ConvPartials step, a tile reads no input
    element twice, and each vertex's input is at most its output block's
    receptive field (the block, its stride, and the kernel's halo)."""
    x, w = rand(shape, np.float32, 0), rand((3, 3, shape[-1], 4), np.float32, 1)
    conv = lambda x, w: lax.conv_general_dilated(x, w, strides, "SAME", dimension_numbers=NHWC)  # noqa: E731
    program = _compiled(conv, x, w)
    (cs,) = _conv_steps(program)
    vertices = cs.vertices
    tensor, intervals, offsets = vertices.reads[0]
    assert tensor.size == x.size
    _, n_s, h_s, w_s, c_s, _, kh_s, kw_s = _splits(cs.name)
    out = [-(-shape[1] // strides[0]), -(-shape[2] // strides[1])]
    n_b, c_b = -(-shape[0] // n_s), -(-shape[-1] // c_s)
    o_b = [-(-out[0] // h_s), -(-out[1] // w_s)]
    k_b = [-(-3 // kh_s), -(-3 // kw_s)]
    field = [(o - 1) * s + k for o, s, k in zip(o_b, strides, k_b, strict=True)]
    bound = n_b * c_b * field[0] * field[1]
    per_tile = {}
    for v in range(len(vertices)):
        lo, hi = offsets[v]
        iv = np.asarray(intervals[lo:hi], np.int64)
        received = int((iv[:, 1] - iv[:, 0]).sum())
        assert received <= bound, (v, received, bound)
        per_tile.setdefault(int(vertices.tiles[v]), []).append(iv)
    for tile, ivs in per_tile.items():
        elements = np.concatenate([np.arange(a, b) for a, b in np.concatenate(ivs)])
        assert len(np.unique(elements)) == len(elements), tile
    assert_matches_cpu(conv, x, w, rtol=1e-5, atol=1e-5)


def test_fallback_is_named_in_the_log_and_the_profile(monkeypatch, caplog):
    """A convolution the planned path does not take (here: every axis made
    too long for it) falls back to the im2col matmul, logged with its
    reason, its compute sets named so, its values still right."""
    from jax_ipu.compiler.lowering import conv as conv_lowering
    monkeypatch.setattr(conv_lowering, "MAX_AXIS_PAIRS", 4)
    x, w = rand((2, 6, 6, 4), np.float32, 0), rand((3, 3, 4, 5), np.float32, 1)
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)  # noqa: E731
    with caplog.at_level(logging.INFO, logger="jax_ipu.compiler.lowering.conv"):
        program = _compiled(conv, x, w)
    assert any("im2col" in r.getMessage() and "a window of 3 over 6 outputs" in r.getMessage()
               for r in caplog.records)
    names = [cs.name for cs in _compute_sets(program)]
    assert any("im2col: a window of 3 over 6 outputs" in n for n in names), names
    assert not _conv_steps(program)
    assert (1, 2 * 6 * 6, 3 * 3 * 4) in _copied_shapes(program)
    np.testing.assert_allclose(run_ipu(conv, x, w)[0], on_cpu(conv, x, w), rtol=1e-5, atol=1e-5)


def test_kernel_in_another_layout_is_read_in_place():
    """An OIHW kernel is read through a view (the vertices' intervals name
    its elements where they lie), as is the NHWC input: nothing copied."""
    x = rand((2, 6, 6, 4), np.float32, 0)
    oihw = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME",  # noqa: E731
                                                 dimension_numbers=("NHWC", "OIHW", "NHWC"))
    w2 = rand((5, 4, 3, 3), np.float32, 2)
    copies = _copied_shapes(_compiled(oihw, x, w2))
    assert copies == []
    assert_matches_cpu(oihw, x, w2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("partials,out", [(None, np.float16), ("half", np.float16), ("half", np.float32)],
                         ids=["default", "half", "half-f32-result"])
def test_partials_type(partials, out):
    """float16 convolutions keep float32 partials by default and float16
    ones with partials_type="half" when the result is float16 (a float32
    result keeps float32 partials); the values match XLA:CPU within
    float16's error for a 36-term sum."""
    from helpers import SMALL
    from jax_ipu.model.engine import Engine
    x, w = rand((2, 6, 6, 4), np.float16, 0), rand((3, 3, 4, 5), np.float16, 1)
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC,  # noqa: E731
                                                 preferred_element_type=out)
    options = {} if partials is None else {"partials_type": partials}
    from helpers import compile_fn
    program = compile_fn(conv, x, w, **options)
    (cs,) = _conv_steps(program)
    want = np.float16 if partials == "half" and out == np.float16 else np.float32
    assert cs.kernel.out.dtype == want
    assert f"<float16,{np.dtype(want).name}>" in cs.vertices.codelet
    got = Engine(SMALL).run(program, [x, w])
    assert_matches_cpu(conv, x, w, rtol=0, atol=F16_TOL, scaled=True, got=got)


def test_partials_type_as_a_compiler_option():
    """partials_type through jax.jit's compiler_options: Poplar's names and
    numpy's, anything else refused naming the choices."""
    ipu = jax.devices("ipu")[0]
    x, w = jax.device_put((rand((1, 5, 5, 2), np.float16, 0), rand((3, 3, 2, 3), np.float16, 1)), ipu)
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)  # noqa: E731
    want = on_cpu(conv, np.asarray(x), np.asarray(w))
    for value in ("half", "float16", "float"):
        got = jax.jit(conv).lower(x, w).compile(compiler_options={"partials_type": value})(x, w)
        np.testing.assert_allclose(np.asarray(got, np.float32), want.astype(np.float32), atol=2e-2 * abs(want).max())
    with pytest.raises(Exception, match="partials_type"):
        jax.jit(conv).lower(x, w).compile(compiler_options={"partials_type": "double"})


@pytest.mark.parametrize("reverse", [(True, False), (True, True)], ids=["reverse-h", "reverse-hw"])
def test_window_reversal(reverse):
    """stablehlo.convolution's window_reversal (JAX never emits it; other
    front ends may): the planned convolution reads the kernel from the far
    end along each reversed dimension, as a convolution of the flipped
    kernel does on XLA:CPU. The module is JAX's, its reverse attribute
    edited."""
    from helpers import SMALL
    from jax_ipu.compiler import compile_module
    from jax_ipu.compiler.options import CompileOptions
    from jax_ipu.model.engine import Engine
    from jax_ipu.stablehlo import import_module
    x, w = rand((2, 7, 6, 3), np.float32, 0), rand((3, 2, 3, 4), np.float32, 1)
    conv = lambda x, w: lax.conv_general_dilated(x, w, (2, 1), ((1, 1), (0, 1)),  # noqa: E731
                                                 rhs_dilation=(1, 2), dimension_numbers=NHWC)
    text = jax.jit(conv).lower(x, w).as_text()
    flags = ", ".join("true" if r else "false" for r in reverse)
    assert "reverse = [false, false]" in text
    program = compile_module(import_module(text.replace("reverse = [false, false]", f"reverse = [{flags}]")),
                             SMALL, CompileOptions())
    assert len(_conv_steps(program)) == 1
    (got,) = Engine(SMALL).run(program, [x, w])
    flipped = w[::-1] if reverse == (True, False) else w[::-1, ::-1]
    np.testing.assert_allclose(got, on_cpu(conv, x, np.ascontiguousarray(flipped)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [("NC", "IO", "NC"), ("CN", "OI", "NC")])
def test_a_convolution_without_spatial_dimensions_is_a_product(spec):
    """No spatial dimension (JAX's 0-D convolutions): a product of feature
    vectors, with its gradients; the planned path (which walks a field)
    hands it to the matmul, so it must not fail."""
    x = rand((10, 5) if spec[0] == "NC" else (5, 10), np.float32, 0)
    w = rand((5, 7) if spec[1] == "IO" else (7, 5), np.float32, 1)

    def f(x, w):
        return lax.conv_general_dilated(x, w, (), "VALID", dimension_numbers=spec)

    assert_matches_cpu(f, x, w)
    assert_matches_cpu(jax.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1)), x, w)
