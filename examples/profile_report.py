"""A profile of a ResNet-style training step, as a report page to open in a
browser (what PopVision's Graph Analyser shows: memory per tile, liveness,
the program tree, compute sets, the BSP view of the run).

    python examples/profile_report.py [--out profile] [--batch 16]

Trains a small residual CNN with batch norm (Flax linen, Optax SGD with
momentum; parameters, batch statistics and optimiser state donated) for a
few steps on random CIFAR-shaped data while profiling, then writes
OUT/<program>-<n>.json (the report), .trace.json (the timeline) and .html
(the page; it needs plotly: pip install 'jax-ipu[report]').
"""
import argparse
import functools
import os

import flax.linen as nn
import jax
import numpy as np
import optax

import jax_ipu


class Block(nn.Module):
    features: int
    stride: int

    @nn.compact
    def __call__(self, x, train):
        norm = functools.partial(nn.BatchNorm, use_running_average=not train)
        y = nn.relu(norm()(nn.Conv(self.features, (3, 3), self.stride, use_bias=False)(x)))
        y = norm()(nn.Conv(self.features, (3, 3), use_bias=False)(y))
        if x.shape != y.shape:
            x = norm()(nn.Conv(self.features, (1, 1), self.stride, use_bias=False)(x))
        return nn.relu(x + y)


class ResNet(nn.Module):
    blocks: tuple = ((16, 1), (32, 2), (64, 2))

    @nn.compact
    def __call__(self, x, train):
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(nn.Conv(16, (3, 3), use_bias=False)(x)))
        for features, stride in self.blocks:
            x = Block(features, stride)(x, train)
        return nn.Dense(10)(x.mean((1, 2)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="profile", help="directory for the report, timeline and page")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    model, tx = ResNet(), optax.sgd(0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 32, 32, 3)).astype(np.float32)
    y = (np.arange(args.batch) % 10).astype(np.int32)
    with jax.default_device(jax.devices("cpu")[0]):          # initialise on the CPU
        variables = model.init(jax.random.key(0), x[:2], False)

    def loss_fn(params, stats, x, y):
        logits, updates = model.apply({"params": params, "batch_stats": stats}, x, True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates["batch_stats"]

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def train_step(params, stats, opt_state, x, y):
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss

    ipu = jax.devices("ipu")[0]
    state = jax.device_put((variables["params"], variables["batch_stats"], tx.init(variables["params"])), ipu)
    batch = jax.device_put((x, y), ipu)
    with jax_ipu.profiling(args.out, html=True):
        for _ in range(args.steps):
            *state, loss = train_step(*state, *batch)
            print(f"loss {float(loss):.4f}")
    for name in sorted(os.listdir(args.out)):
        print(os.path.join(args.out, name))


if __name__ == "__main__":
    main()
