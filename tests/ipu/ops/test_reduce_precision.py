"""stablehlo.reduce_precision (round to nearest even at fewer mantissa
bits, overflow to infinity and underflow to zero at fewer exponent bits,
NaN kept) on the ipu device against JAX's CPU backend, bit for bit."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

FORMATS = [(8, 7), (5, 10), (4, 3), (5, 2), (8, 23), (3, 1), (6, 0)]


def values(dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(200) * np.exp2(rng.integers(-30, 30, 200))).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 1.0009765625, 65504.0, 65520.0,
                        6e-8, 3e38, -3e-30], np.float32)   # no f32 subnormals: XLA:CPU flushes them
    with np.errstate(over="ignore"):
        return np.concatenate([x, special]).astype(dtype)


# Formats no wider than the operand's own.
CASES = [(dtype, e, m) for dtype in (np.float32, np.float16) for e, m in FORMATS
         if np.dtype(dtype) == np.float32 or (e <= 5 and m <= 10)]


@pytest.mark.parametrize("dtype, exponent_bits, mantissa_bits", CASES,
                         ids=[f"{np.dtype(d).name}-e{e}m{m}" for d, e, m in CASES])
def test_reduce_precision(dtype, exponent_bits, mantissa_bits):
    ipu, cpu = jax.devices("ipu")[0], jax.devices("cpu")[0]
    f = jax.jit(lambda a: lax.reduce_precision(a * a.dtype.type(1.5), exponent_bits, mantissa_bits))
    x = values(dtype)
    got, want = np.asarray(f(jax.device_put(x, ipu))), np.asarray(f(jax.device_put(x, cpu)))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(got)].tobytes() == want[~np.isnan(want)].tobytes()
