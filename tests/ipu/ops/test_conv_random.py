"""Random convolutions over every attribute stablehlo.convolution has as
JAX emits it (strides, padding including negative, lhs and rhs dilation,
feature or batch groups, any dimension order, 1 to 3 spatial dimensions,
float32 and float16), with both gradients (the input gradient an
lhs-dilated convolution of the reversed kernel, the weight gradient a
batch-grouped one), against XLA:CPU. Each is compiled for a 16-tile
IPU, so that even these small problems are split over tiles, and runs on
the planned path (no im2col compute set).

The default run draws a few programs (derandomized, the same every run);
`pytest -m slow tests/ipu/ops/test_conv_random.py` draws many more.

Tolerances: float32 1e-4 of each result's scale (partial sums added in
another order than XLA:CPU's); float16 2e-2 of the scale (float16
operands rounded, float32 partials, one rounding of the result)."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn
from jax_ipu.graph import programs as p
from jax_ipu.model.engine import Engine

LETTERS = "HWD"


@st.composite
def convolutions(draw):
    """(lhs shape, rhs shape, conv_general_dilated kwargs, dtype)."""
    spatial = draw(st.integers(1, 3) if draw(st.booleans()) else st.just(2))
    mode = draw(st.sampled_from(["none", "feature", "batch"]))
    groups = 1 if mode == "none" else draw(st.integers(2, 3))
    batch, cin, cout = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sizes, window, strides, pads, lhs_dil, rhs_dil = [], [], [], [], [], []
    for _ in range(spatial):
        size, k = draw(st.integers(1, 9 if spatial < 3 else 5)), draw(st.integers(1, 4))
        s, ld, rd = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
        lo, hi = draw(st.integers(-1, 3)), draw(st.integers(-1, 3))
        padded = (size - 1) * ld + 1 + lo + hi
        span = (k - 1) * rd + 1
        if padded < span:
            lo += span - padded
        sizes.append(size), window.append(k), strides.append(s), pads.append((lo, hi))
        lhs_dil.append(ld), rhs_dil.append(rd)
    letters = LETTERS[:spatial]
    lhs_spec = "".join(draw(st.permutations("NC" + letters)))
    rhs_spec = "".join(draw(st.permutations("OI" + letters)))
    out_spec = "".join(draw(st.permutations("NC" + letters)))
    n = batch * (groups if mode == "batch" else 1)
    c = cin * (groups if mode == "feature" else 1)
    dims = {"N": n, "C": c, **dict(zip(letters, sizes, strict=True))}
    kdims = {"O": cout * groups, "I": cin, **dict(zip(letters, window, strict=True))}
    kwargs = dict(window_strides=tuple(strides), padding=tuple(pads), lhs_dilation=tuple(lhs_dil),
                  rhs_dilation=tuple(rhs_dil), dimension_numbers=(lhs_spec, rhs_spec, out_spec),
                  feature_group_count=groups if mode == "feature" else 1,
                  batch_group_count=groups if mode == "batch" else 1)
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    return tuple(dims[a] for a in lhs_spec), tuple(kdims[a] for a in rhs_spec), kwargs, dtype


def check(case, seed):
    lhs_shape, rhs_shape, kwargs, dtype = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(lhs_shape).astype(dtype)
    w = rng.standard_normal(rhs_shape).astype(dtype)
    conv = lambda x, w: lax.conv_general_dilated(x, w, **kwargs)  # noqa: E731
    out_shape = jax.eval_shape(conv, x, w).shape
    ct = rng.standard_normal(out_shape).astype(dtype)

    def forward_and_gradients(x, w, ct):
        y, vjp = jax.vjp(conv, x, w)
        return (y, *vjp(ct))
    args = (x, w, ct)
    program = compile_fn(forward_and_gradients, *args)
    names = [s.compute_set.name for s in p.leaves(program.body) if isinstance(s, p.Execute)]
    assert not any("im2col" in n for n in names), [n for n in names if "im2col" in n]
    got = Engine(SMALL).run(program, [np.asarray(a) for a in args])
    tol = 2e-2 if dtype == np.float16 else 1e-4
    assert_matches_cpu(forward_and_gradients, *args, rtol=0, atol=tol, scaled=True, got=got)


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=8, derandomize=True, **SETTINGS)
@given(convolutions(), st.integers(0, 2 ** 31))
def test_random_convolutions_and_gradients(case, seed):
    check(case, seed)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=150, **SETTINGS)
@given(convolutions(), st.integers(0, 2 ** 31))
def test_many_random_convolutions_and_gradients(case, seed):
    check(case, seed)
