"""Trains an MLP classifier of handwritten digits on the IPU Model.

The data is scikit-learn's digits set (1,797 8x8 images, shipped inside the
package: nothing is downloaded). As Graphcore's performance guide advises,
parameters are initialised on the CPU (JAX's default backend), the training
step runs on the IPU with its parameters donated, so they stay in the IPU's
memory between steps and only each batch crosses the host link.

    python examples/mnist_classifier.py [--epochs 10] [--batch 128]
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

import jax_ipu


def init_params(key, sizes):
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (fan_in, fan_out)) * np.sqrt(2.0 / fan_in),
                       jnp.zeros(fan_out)))
    return params


def predict(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def loss_fn(params, x, labels):
    logits = predict(params, x)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, 10), axis=-1))


def sgd_step(params, x, labels, lr=0.05):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


def accuracy(params, x, labels):
    return jnp.mean(jnp.argmax(predict(params, x), axis=-1) == labels)


def load_data(seed=0):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args(argv)

    ipu = jax.devices("ipu")[0]
    (train_x, train_y), (test_x, test_y) = load_data()
    params = init_params(jax.random.key(0), [64, args.hidden, args.hidden, 10])  # on the CPU
    params = jax.device_put(params, ipu)  # once: from now on they live in the IPU's memory

    step = jax.jit(sgd_step, donate_argnums=0)
    steps_per_epoch = len(train_x) // args.batch
    batch = (train_x[:args.batch], train_y[:args.batch])
    compiled = step.lower(params, *batch).compile()
    cycles = compiled.cost_analysis().get("estimated_cycles", 0.0)
    ipu_us = jax_ipu.estimated_seconds(cycles, ipu) * 1e6
    print(f"{ipu.device_kind}: one training step is estimated at {cycles:,.0f} cycles "
          f"({ipu_us:.1f} us of IPU time, host transfers excluded)")

    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(len(train_x))
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{args.epochs}", leave=False)
        for i in bar:
            idx = order[i * args.batch:(i + 1) * args.batch]
            params, loss = step(params, train_x[idx], train_y[idx])
        bar.close()
        acc = float(jax.jit(accuracy)(params, test_x, test_y))
        print(f"epoch {epoch + 1}: loss {float(loss):.3f}, test accuracy {acc:.3f}")
    elapsed = time.perf_counter() - start
    total_steps = args.epochs * steps_per_epoch
    print(f"{total_steps / elapsed:.1f} steps/s on the IPU Model (wall time), "
          f"estimated IPU time per step {ipu_us:.1f} us")
    return acc


if __name__ == "__main__":
    main()
