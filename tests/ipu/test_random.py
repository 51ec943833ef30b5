"""jax.random with default threefry keys on the ipu device against JAX's
CPU backend: integer outputs bit-for-bit; float outputs within 1 ulp-ish
(f32 atol 1e-6; the integer bits are identical, float transforms such as
erf_inv may round differently). rbg keys (stablehlo.rng_bit_generator)
are not supported yet (their state is uint64) and fail at compile time
naming the op and rng_bit_generator."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

SAMPLERS = {
    "bits": lambda k: jax.random.bits(k, (7, 5)),
    "bits-u8": lambda k: jax.random.bits(k, (33,), dtype=jnp.uint8),
    "split": lambda k: jax.random.key_data(jax.random.split(k, 4)),
    "fold_in": lambda k: jax.random.key_data(jax.random.fold_in(k, 7)),
    "uniform": lambda k: jax.random.uniform(k, (100,)),
    "uniform-f16": lambda k: jax.random.uniform(k, (3, 9), dtype=jnp.float16, minval=-2, maxval=3),
    "normal": lambda k: jax.random.normal(k, (4, 25)),
    "randint": lambda k: jax.random.randint(k, (50,), -5, 17),
    "bernoulli": lambda k: jax.random.bernoulli(k, 0.3, (64,)),
    "categorical": lambda k: jax.random.categorical(k, jnp.log(jnp.arange(1.0, 6.0)), shape=(20,)),
    "permutation": lambda k: jax.random.permutation(k, 20),
    "choice": lambda k: jax.random.choice(k, 10, (5,), replace=False),
    "truncated_normal": lambda k: jax.random.truncated_normal(k, -1.0, 2.0, (30,)),
    "gamma": lambda k: jax.random.gamma(k, 2.5, (10,)),
}


@pytest.mark.parametrize("seed", [0, 42])
@pytest.mark.parametrize("name", list(SAMPLERS), ids=lambda n: f"threefry-{n}")
def test_threefry_matches_cpu(name, seed):
    f = SAMPLERS[name]
    ipu, cpu = jax.devices("ipu")[0], jax.devices("cpu")[0]
    got = np.asarray(jax.jit(f)(jax.device_put(jax.random.key(seed), ipu)))
    want = np.asarray(jax.jit(f)(jax.device_put(jax.random.key(seed), cpu)))
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-6 if want.dtype == np.float32 else 1e-3, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)


def test_legacy_uint32_keys():
    ipu, cpu = jax.devices("ipu")[0], jax.devices("cpu")[0]
    f = lambda k: jax.random.uniform(k, (16,))  # noqa: E731
    key = jax.random.PRNGKey(3)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(jax.device_put(key, ipu))),
                                  np.asarray(jax.jit(f)(jax.device_put(key, cpu))))


def test_rbg_keys_are_a_clear_error():
    key = jax.device_put(jax.random.key(0, impl="rbg"), jax.devices("ipu")[0])
    with pytest.raises(Exception, match="rng_bit_generator"):
        jax.jit(lambda k: jax.random.bits(k, (4,)))(key).block_until_ready()
