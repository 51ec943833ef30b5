"""An MLP's SGD step and its inputs: run by
test_independent_steps_side_by_side.py here and in a fresh process."""
import jax
import jax.numpy as jnp
import numpy as np


def mlp_step(params, x):
    """An MLP's SGD step: its backward pass has an input-gradient and a
    weight-gradient product side by side, and the updates of every
    parameter are independent."""
    def loss(params):
        h = x
        for w in params[:-1]:
            h = jax.nn.relu(h @ w)
        return jnp.mean((h @ params[-1]) ** 2)
    grads = jax.grad(loss)(params)
    return [w - 0.01 * g for w, g in zip(params, grads, strict=True)]


def mlp_inputs(seed=0):
    rng = np.random.default_rng(seed)
    params = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
              for a, b in [(512, 512), (512, 512), (512, 16)]]
    return params, rng.standard_normal((128, 512)).astype(np.float32)
