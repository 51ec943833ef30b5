"""float16 operands of float32 matmul and convolution partials
(model/fast/matmul.py, model/fast/conv.py): a view is read as one strided
array of its tensor (model/fast/strided.py), the tensor converted first
when the view reads its elements at least once each (a convolution's
windows, broadcasts). The values must be the bits of
converting the view's elements one by one, and within float16 rounding of
XLA:CPU's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import SMALL, compile_fn, on_cpu
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import conv, matmul, strided, xla_chains

rng = np.random.default_rng(3)


def _conv(x, w, stride, padding):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), padding,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        preferred_element_type=jnp.float32)


CASES = {
    "3x3 same": (lambda x, w: _conv(x, w, 1, "SAME"), (2, 14, 14, 16), (3, 3, 16, 8)),
    "3x3 stride 2 valid": (lambda x, w: _conv(x, w, 2, "VALID"), (1, 15, 15, 8), (3, 3, 8, 12)),
    "7x7 stride 2 same": (lambda x, w: _conv(x, w, 2, "SAME"), (1, 20, 20, 3), (7, 7, 3, 16)),
    "broadcast lhs": (lambda x, w: jnp.broadcast_to(x[:, :1], (x.shape[0], 16, x.shape[2])) @ w,
                      (4, 3, 24), (24, 10)),
    "weight gradient": (lambda x, w: jax.grad(lambda w: jnp.sum(_conv(x, w, 1, "SAME") ** 2))(w),
                        (2, 10, 10, 8), (3, 3, 8, 4)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_converted_operands_keep_the_bits(monkeypatch, name, dtype):
    f, xs, ws = CASES[name]
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) * 0.2).astype(dtype)
    program = compile_fn(f, x, w)
    taken = []
    planner = strided.operand_reader

    def counted(view, acc):
        read = planner(view, acc)
        if read is None:
            return None

        def counting(state):
            value = read(state)
            taken.append((view.dtype, None if value is None else value.dtype))
            return value
        return counting
    monkeypatch.setattr(strided, "operand_reader", counted)
    got = Engine(SMALL).run(program, [x, w])
    # The path under test is taken (the engine reads the windows lazily):
    # float16 views come out as float32 arrays.
    halves = [out for dtype_in, out in taken if dtype_in == np.float16]
    assert bool(halves) == (dtype == np.float16) and all(t == np.float32 for t in halves)

    def element_by_element(view, acc, read):
        get = read(view)
        return get if view.dtype == acc else (lambda state: get(state).astype(acc))
    monkeypatch.setattr(matmul, "converted", element_by_element)
    monkeypatch.setattr(conv, "converted", element_by_element)
    want_model = Engine(SMALL).run(compile_fn(f, x, w), [x, w])
    for g, m in zip(got, want_model, strict=True):
        if name == "weight gradient":
            # The weight gradient's operands come to BLAS in another layout
            # read element by element (its batch and field are the
            # contraction), and BLAS rounds a product of transposed operands
            # its own way (docs/semantics.md): within a few float32 ulps,
            # or one float16 ulp of a float16 result that rounding flips.
            scale = float(np.max(np.abs(m.astype(np.float32)))) or 1.0
            ulps = 1e-6 if m.dtype == np.float32 else 2.0 ** -10
            np.testing.assert_allclose(g.astype(np.float32), m.astype(np.float32), rtol=0, atol=ulps * scale)
        else:
            np.testing.assert_array_equal(g, m)
    want = jax.tree.leaves(on_cpu(f, x, w))
    for g, c in zip(got, want, strict=True):
        assert g.dtype == c.dtype
        scale = float(np.max(np.abs(np.asarray(c, np.float32)))) or 1.0
        tol = 3e-3 if c.dtype == np.float16 else 2e-5
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(c, np.float32), rtol=tol, atol=tol * scale)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    width = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    nan = np.isnan(a) & np.isnan(b)
    return a.dtype == b.dtype and bool(np.all((a.view(width) == b.view(width)) | nan))


def _count_conversions(monkeypatch) -> list:
    """The arguments of each XLA:CPU conversion kernel made from now on."""
    taken = []
    real = xla_chains._converter

    def counted(*args):
        taken.append(args)
        return real(*args)
    monkeypatch.setattr(xla_chains, "_converter", counted)
    return taken


def test_xla_convert_gives_numpys_bits(monkeypatch):
    """xla_chains.convert: every float16 value to float32, and float32
    values around float16's ties, subnormals, overflow, NaN and -0 to
    float16, bit for bit as numpy's astype; large aligned contiguous
    arrays go to XLA:CPU, others to numpy."""
    every = np.tile(np.arange(1 << 16, dtype=np.uint16).view(np.float16), 2)    # 2^17 elements
    taken = _count_conversions(monkeypatch)
    aligned = xla_chains.aligned_copy(every)
    got = xla_chains.convert(aligned, np.float32)
    assert len(taken) == 1 and _bits_equal(got, every.astype(np.float32))
    halves = every.astype(np.float32)
    # The Model's threads ignore floating-point errors (overflow to inf); so does this part.
    with np.errstate(all="ignore"):
        edges = np.concatenate([
            halves * np.float32(1 + 2 ** -11),                   # ties between float16 neighbours
            halves * np.float32(1 + 2 ** -12), halves * np.float32(1 - 2 ** -12),
            rng.standard_normal(1 << 17).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 1 << 17),
            np.array([65504, 65519.99, 65520, 1e30, -np.inf, np.nan, -0.0, 2 ** -25, 3 * 2 ** -26, 1e-40],
                     np.float32)]).astype(np.float32)
        aligned = xla_chains.aligned_copy(edges)
        want = edges.astype(np.float16)
        got = xla_chains.convert(aligned, np.float16)
        assert len(taken) == 2 and _bits_equal(got, want)
        misaligned = np.empty(edges.nbytes + 4, np.uint8)[4:].view(np.float32)
        misaligned[...] = edges
        got = xla_chains.convert(misaligned, np.float16)
        assert len(taken) == 2 and _bits_equal(got, want)                         # numpy's astype
        xla_chains.convert(xla_chains.aligned_copy(edges[:1000]), np.float16)
        xla_chains.convert(aligned[::2], np.float16)
    assert len(taken) == 2


@pytest.mark.parametrize("shape", [(256, 768, 1024), (300, 1000, 700), (2, 257, 640, 260)])
def test_large_float16_products_through_xla_conversions(monkeypatch, shape):
    """Products large enough for XLA:CPU conversions (operands and the
    float16 result): the bits of numpy's conversions, and within float16
    rounding of XLA:CPU's product."""
    *batch, m, k, n = shape
    x = rng.standard_normal((*batch, m, k)).astype(np.float16)
    w = (rng.standard_normal((*batch, k, n)) / np.sqrt(k)).astype(np.float16)
    f = jnp.matmul
    program = compile_fn(f, x, w)
    calls = _count_conversions(monkeypatch)
    got = Engine(SMALL).run(program, [xla_chains.aligned_copy(x), xla_chains.aligned_copy(w)])[0]
    assert calls                                                   # the XLA conversions were taken
    monkeypatch.setattr(xla_chains, "CONVERT_MIN_ELEMENTS", 1 << 40)
    want_model = Engine(SMALL).run(program, [x, w])[0]
    assert _bits_equal(got, want_model)
    want = np.asarray(on_cpu(f, x, w), np.float32)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=4e-3, atol=4e-3 * float(np.max(np.abs(want))))
