"""bfloat16 mixed precision as Flax writes it (modules with
dtype=bfloat16 and float32 parameters: activations and products in
bfloat16, parameters, optimizer state and loss in float32): a training step
through the plugin against XLA:CPU's.

Tolerance: every op rounds to bfloat16 on both sides, but XLA:CPU fuses
some element-wise chains and sums products in another order, so single
activations may differ by a bfloat16 ulp (2^-8 relative) and the
gradients by a few; the step's results are compared at 3 bfloat16 ulps of
their scale. The loss, which averages them, closer."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import assert_matches_cpu

BF16_ULP = 2.0 ** -8


class _Net(nn.Module):
    conv: bool = True     # else an MLP on the flattened input (a faster test)

    @nn.compact
    def __call__(self, x, train: bool):
        if self.conv:
            x = nn.Conv(8, (3, 3), use_bias=False, dtype=jnp.bfloat16)(x)   # (BatchNorm cancels a bias)
            x = nn.BatchNorm(use_running_average=not train, dtype=jnp.bfloat16)(x)
            x = nn.gelu(x)
            x = x.mean((1, 2))
        else:
            x = nn.gelu(nn.Dense(64, dtype=jnp.bfloat16)(x.reshape(x.shape[0], -1)))
        x = nn.Dense(32, dtype=jnp.bfloat16)(x)
        x = nn.LayerNorm(dtype=jnp.bfloat16)(nn.relu(x))
        return nn.Dense(10, dtype=jnp.bfloat16)(x).astype(jnp.float32)


def _step_and_args(conv: bool = True):
    model, tx = _Net(conv), optax.sgd(0.1, momentum=0.9)
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 3)).astype(np.float32)
    y = np.array([1, 3, 0, 9], np.int32)
    with jax.default_device(jax.devices("cpu")[0]):
        variables = jax.jit(lambda: model.init(jax.random.PRNGKey(0), x, False))()

    def step(params, stats, opt_state, x, y):
        def loss_fn(params):
            logits, updates = model.apply({"params": params, **stats}, x, True, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss, grads
    stats = {k: v for k, v in variables.items() if k != "params"}
    return step, (variables["params"], stats, tx.init(variables["params"]), x, y)


def test_bfloat16_mixed_precision_mlp_training_step_matches_xla_cpu():
    _check_step(*_step_and_args(conv=False))


@pytest.mark.slow
def test_bfloat16_mixed_precision_conv_batchnorm_training_step_matches_xla_cpu():
    _check_step(*_step_and_args(conv=True))


def _check_step(step, args):
    # The parameters stay float32; the compute is bfloat16.
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(args[0]))
    text = jax.jit(step).lower(*args).as_text()
    assert "bf16" in text and "dot_general" in text
    got = assert_matches_cpu(step, *args, rtol=3 * BF16_ULP, atol=3 * BF16_ULP, scaled=True)
    want = jax.jit(step)(*jax.device_put(args, jax.devices("cpu")[0]))
    np.testing.assert_allclose(got[3], np.asarray(want[3]), rtol=BF16_ULP)


@pytest.mark.slow
def test_bfloat16_training_reduces_the_loss_as_on_xla_cpu():
    """Five steps: the loss falls on both, along the same path."""
    step, (params, stats, opt_state, x, y) = _step_and_args()
    losses = {}
    for name in ("ipu", "cpu"):
        device = jax.devices(name)[0]
        state = jax.device_put((params, stats, opt_state), device)
        jitted, seen = jax.jit(step), []
        for _ in range(5):
            p, s, o, loss, _ = jitted(*state, *jax.device_put((x, y), device))
            state = (p, s, o)
            seen.append(float(loss))
        losses[name] = np.array(seen)
    assert losses["ipu"][-1] < losses["ipu"][0]
    np.testing.assert_allclose(losses["ipu"], losses["cpu"], rtol=4 * BF16_ULP)
