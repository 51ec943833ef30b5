"""Input dilation moved past a convolution whose kernel is one position
wide (compiler/passes/dilate_post_conv.py, poplin's dilatePostConv): the
input gradient of a strided 1x1 convolution (a ResNet projection's) is a
convolution of the undilated output gradient, spread with zeros by a pad.
Results against XLA:CPU; the plan's multiply-adds and partials shrink by
the dilation."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu, compile_fn
from jax_ipu.graph import programs as p
from jax_ipu.graph.codelets_conv import ConvPartials

NHWC = ("NHWC", "HWIO", "NHWC")


def rand(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# (lhs shape, rhs shape, kwargs): 1-wide kernels along the dilated
# dimensions, stride 1 there; padding that crops, extends, or leaves some
# outputs reading nothing at all; one dimension rewritten and one not.
CASES = {
    "2d-1x1": ((2, 5, 6, 8), (1, 1, 8, 4), dict(padding=((0, 1), (0, 1)), lhs_dilation=(2, 2))),
    "2d-1x1-pads": ((1, 5, 4, 3), (1, 1, 3, 2), dict(padding=((3, -2), (-1, 4)), lhs_dilation=(3, 2))),
    "one-dim-only": ((2, 6, 5, 3), (1, 3, 3, 4), dict(padding=((1, 1), (1, 1)), lhs_dilation=(2, 2))),
    "groups": ((2, 4, 4, 6), (1, 1, 2, 6), dict(padding=((0, 1), (2, 0)), lhs_dilation=(2, 3),
                                                 feature_group_count=3)),
    "nothing-read": ((1, 3, 3, 2), (1, 1, 2, 2), dict(padding=((-1, -3), (0, 0)), lhs_dilation=(2, 2))),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"stablehlo.convolution-{c}")
def test_dilated_one_wide_convolution_matches_cpu(case, dtype):
    lhs, rhs, kwargs = CASES[case]
    tol = dict(rtol=0, atol=2e-2, scaled=True) if dtype == np.float16 else dict(rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), dimension_numbers=NHWC, **kwargs),
                       rand(lhs, dtype, 0), rand(rhs, dtype, 1), **tol)


def _projection_loss(x, w):
    y = lax.conv_general_dilated(x, w, (2, 2), "VALID", dimension_numbers=NHWC)
    return (y * y).sum()


@pytest.mark.parametrize("size", [8, 9], ids=lambda s: f"stablehlo.convolution-grad-{s}x{s}")
def test_strided_1x1_gradients_match_cpu(size):
    """jax.grad of a stride-2 1x1 convolution (odd sizes leave the last
    input row and column unread)."""
    x, w = rand((2, size, size, 8), np.float32, 0), rand((1, 1, 8, 16), np.float32, 1)
    assert_matches_cpu(jax.grad(_projection_loss, argnums=(0, 1)), x, w, rtol=1e-4, atol=1e-4)


def test_input_gradient_convolves_the_undilated_gradient():
    """The input gradient's ConvPartials write a quarter of the input's
    positions (the others are zeros put by a Copy), so its partials are a
    quarter of what the dilated convolution would accumulate."""
    x, w = rand((2, 16, 16, 32), np.float16, 0), rand((1, 1, 32, 64), np.float16, 1)
    program = compile_fn(jax.grad(lambda x, w: _projection_loss(x, w).astype(np.float32)), x, w)
    convs = [s.compute_set for s in p.leaves(program.body)
             if isinstance(s, p.Execute) and isinstance(s.compute_set.kernel, ConvPartials)]
    partials = [cs.kernel.out.shape for cs in convs]
    # forward [.., 2, 8, 8, 64] and input gradient [.., 2, 8, 8, 32]: no
    # partials over the 16 x 16 field.
    assert partials and all(16 not in shape for shape in partials), partials
    assert any(shape[-1] == 32 for shape in partials), partials
