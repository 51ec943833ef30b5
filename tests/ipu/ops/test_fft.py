"""jnp.fft on the IPU (stablehlo.fft, compiler/passes/fft.py): planned on
tiles as float32 products and element-wise ops on the parts, against
XLA:CPU's DUCC FFT. Lengths cross every branch of the plan: one DFT
product (n <= 64), Cooley-Tukey's four steps (composite n, several levels
for n > 64 * 64), Bluestein's chirp convolution (a prime factor above 64).

Tolerance: both sides round differently (a DFT product sums n terms, an
FFT log n levels), so results are compared at the scale of the transform,
|got - want| <= tol * max |want|; Bluestein's convolution, two transforms
longer than the input, gets a wider one."""
from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

from helpers import C64, SMALL, assert_matches_cpu, compile_fn, run_ipu
from jax_ipu.graph.programs import Execute, leaves

TOL = 3e-6
BLUESTEIN_TOL = 3e-5


def _complex(seed: int, shape) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty(shape, C64)
    out.real, out.imag = rng.standard_normal(shape), rng.standard_normal(shape)
    return out


def _real(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _has_large_prime(n: int) -> bool:
    for p in range(2, int(n ** 0.5) + 1):
        while n % p == 0:
            n //= p
            if p > 64:
                return True
    return n > 64


# 1, 2 and 64 (the largest single product), 65 = 5 * 13 and 100 (four steps
# with an odd factor), 127 and 2 * 67 (Bluestein), 96 and 1000, 4096 = 64 * 64.
LENGTHS = [1, 2, 7, 12, 64, 65, 96, 100, 127, 134, 1000, 4096]


@pytest.mark.parametrize("n", LENGTHS)
def test_one_dimensional_transforms_match_xla_cpu(n):
    x, r = _complex(n, (3, n)), _real(n + 1, (3, n))
    tol = BLUESTEIN_TOL if _has_large_prime(n) else TOL

    def f(c, v):
        return jnp.fft.fft(c), jnp.fft.ifft(c), jnp.fft.rfft(v), jnp.fft.irfft(jnp.fft.rfft(v), n)
    assert_matches_cpu(f, x, r, rtol=0, atol=tol, scaled=True, target=SMALL)


@pytest.mark.parametrize("shape", [(8, 12), (5, 66), (3, 4, 6), (4, 9, 10)])
def test_two_and_three_dimensional_transforms_match_xla_cpu(shape):
    x, r = _complex(len(shape), (2, *shape)), _real(7, (2, *shape))
    axes = tuple(range(-len(shape), 0))
    tol = BLUESTEIN_TOL if any(_has_large_prime(n) for n in shape) else TOL

    def f(c, v):
        return (jnp.fft.fftn(c, axes=axes), jnp.fft.ifftn(c, axes=axes), jnp.fft.rfftn(v, axes=axes),
                jnp.fft.irfftn(jnp.fft.rfftn(v, axes=axes), shape, axes=axes))
    assert_matches_cpu(f, x, r, rtol=0, atol=tol, scaled=True, target=SMALL)


def test_irfft_ignores_the_imaginary_parts_of_zero_and_nyquist_frequencies():
    """A C2R transform reads X[0] and X[n/2] as real (as XLA:CPU does)."""
    x = _complex(3, (4, 9))
    assert_matches_cpu(lambda c: (jnp.fft.irfft(c, 16), jnp.fft.irfft(c, 17)), x, rtol=0, atol=TOL, scaled=True,
                       target=SMALL)


def test_fft_of_a_linear_function_and_an_impulse():
    """Known values: the transform of an impulse is constant, of a constant
    an impulse of height n (exact in float32 for these)."""
    n = 256
    impulse = np.zeros((1, n), C64)
    impulse[0, 0] = 1
    ones = np.ones((1, n), C64)
    got = run_ipu(lambda a, b: (jnp.fft.fft(a), jnp.fft.fft(b)), impulse, ones)
    np.testing.assert_allclose(got[0], np.ones((1, n)), atol=1e-6)
    want = np.zeros((1, n))
    want[0, 0] = n
    np.testing.assert_allclose(got[1], want, atol=n * 1e-6)


def test_large_transforms_are_spread_over_tiles():
    """A batch of transforms of length 4096 (two levels of 64) runs as
    compute sets over most of the 16 tiles, none of it on the host."""
    x = _complex(9, (8, 4096))
    program = compile_fn(jnp.fft.fft, x, target=SMALL)
    used = set()
    for step in leaves(program.body):
        if isinstance(step, Execute):
            used.update(step.compute_set.tiles().tolist())
    assert len(used) >= 12
    assert all(not isinstance(step, Execute) or not re.search(r"\bhost\b", step.compute_set.name) for step in leaves(program.body))
    assert_matches_cpu(jnp.fft.fft, x, rtol=0, atol=TOL, scaled=True, got=run_ipu(jnp.fft.fft, x))


def test_fft_through_the_plugin():
    """jnp.fft on arrays placed on an IPU device, the spectrum's magnitude
    (complex results transferred back)."""
    r = _real(11, (4, 48))
    assert_matches_cpu(lambda v: (jnp.abs(jnp.fft.rfft(v)), jnp.fft.fft2(v)), r, rtol=0, atol=TOL, scaled=True)
