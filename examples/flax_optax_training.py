"""A Flax (linen) model trained with an Optax optimiser on the IPU Model.

Parameters and optimiser state are initialised on the CPU, moved to the IPU
once, and donated to every training step, so they stay in the IPU's memory.

    python examples/flax_optax_training.py [--steps 200]
"""
import argparse
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits


class MLP(nn.Module):
    hidden: int = 128

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(self.hidden)(x))
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(10)(x)


def make_train_step(model, optimizer):
    def loss_fn(params, x, labels):
        logits = model.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, x, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)

    ipu = jax.devices("ipu")[0]
    model, optimizer = MLP(), optax.adam(1e-3)
    params = model.init(jax.random.key(0), x[:1])          # on the CPU
    opt_state = optimizer.init(params)
    params, opt_state = jax.device_put((params, opt_state), ipu)
    train_step = make_train_step(model, optimizer)

    rng = np.random.default_rng(0)
    losses = []
    for step in range(args.steps):
        idx = rng.integers(0, len(x), args.batch)
        params, opt_state, loss = train_step(params, opt_state, x[idx], y[idx])
        losses.append(loss)
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {float(loss):.3f}")
    logits = jax.jit(model.apply)(params, x)
    accuracy = float(jnp.mean(jnp.argmax(logits, -1) == y))
    print(f"training-set accuracy {accuracy:.3f}; parameters on {jax.tree.leaves(params)[0].devices()}")
    return [float(l) for l in losses], accuracy


if __name__ == "__main__":
    main()
