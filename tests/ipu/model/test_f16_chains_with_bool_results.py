"""Float16 element-wise chains whose results are not float16 (loss scaling's
`isfinite` over gradients, comparisons) at the sizes where the Model hands
chains to XLA:CPU (model/fast/xla_chains.py, MIN_ELEMENTS and up). Such a
chain never reads the run-time zero that float16 chains take, and a kernel
compiled without the unused argument refused the two it was given."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import run_on
from jax_ipu.model.fast import xla_chains

CHAINS = {
    "isfinite": lambda x, y: jnp.isfinite(x),
    "less_equal": lambda x, y: x <= y,
    "equal_or_less": lambda x, y: (x == y) | (x < y),
    "all_finite": lambda x, y: jnp.isfinite(x) & jnp.isfinite(y) & (x != y),
}
NUMPY = {
    "isfinite": lambda x, y: np.isfinite(x),
    "less_equal": lambda x, y: x <= y,
    "equal_or_less": lambda x, y: (x == y) | (x < y),
    "all_finite": lambda x, y: np.isfinite(x) & np.isfinite(y) & (x != y),
}


def _inputs(n: int):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float16) * np.float16(100)
    y = x.copy()
    y[::3] = rng.standard_normal(len(y[::3])).astype(np.float16)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65504, np.float16(6e-8)], np.float16)
    x[:len(specials)] = specials
    y[1:len(specials) + 1] = specials
    return x, y


@pytest.mark.parametrize("n", [xla_chains.MIN_ELEMENTS - 1, xla_chains.MIN_ELEMENTS, xla_chains.MIN_ELEMENTS + 5,
                               300_000])
@pytest.mark.parametrize("name", list(CHAINS))
def test_a_float16_chain_with_bool_results_runs_at_every_size(ipu, name, n):
    x, y = _inputs(n)
    got = run_on(ipu, CHAINS[name], x, y)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, NUMPY[name](x, y))


def test_isfinite_of_float16_gradients_as_loss_scaling_checks_them(ipu):
    # jmp / optax-style: all(isfinite) over every gradient leaf, large ones included.
    grads = {"w": np.ones((512, 512), np.float16), "b": np.ones(600, np.float16)}
    grads["w"][7, 9] = np.inf

    def finite(g):
        return jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(g)]).all()
    assert not bool(run_on(ipu, finite, grads))
    grads["w"][7, 9] = 1
    assert bool(run_on(ipu, finite, grads))
