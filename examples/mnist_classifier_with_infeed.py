"""Trains the digits MLP with the whole epoch as one on-device loop: the
IPU reads each batch from an infeed queue and writes each loss to an
outfeed queue, so the host never drives individual steps.

    python examples/mnist_classifier_with_infeed.py [--epochs 10] [--batch 128]

Same model and data as mnist_classifier.py; the same code runs on the CPU
backend too (`--platform cpu`), through the feeds' portable fallback.
"""
import argparse
import functools
import pathlib
import runpy
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from tqdm import tqdm

import jax_ipu

classifier = runpy.run_path(str(pathlib.Path(__file__).with_name("mnist_classifier.py")))


def make_epoch(feed, losses):
    @functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
    def epoch(params, steps):
        def body(i, params):
            x, labels = jax_ipu.infeed(feed)
            params, loss = classifier["sgd_step"](params, x, labels)
            jax_ipu.outfeed(losses, loss)
            return params
        return lax.fori_loop(0, steps, body, params)
    return epoch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--platform", default="ipu")
    args = parser.parse_args(argv)

    device = jax.devices(args.platform)[0]
    (train_x, train_y), (test_x, test_y) = classifier["load_data"]()
    steps = len(train_x) // args.batch
    spec = (jax.ShapeDtypeStruct((args.batch, 64), jnp.float32), jax.ShapeDtypeStruct((args.batch,), jnp.int32))
    feed, losses = jax_ipu.InfeedQueue(spec), jax_ipu.OutfeedQueue()
    params = jax.device_put(classifier["init_params"](jax.random.key(0), [64, args.hidden, args.hidden, 10]), device)
    epoch = make_epoch(feed, losses).lower(params, steps).compile()  # compiled before the clock starts

    start, ipu_seconds = time.perf_counter(), 0.0
    for e in range(args.epochs):
        order = np.random.default_rng(e).permutation(len(train_x))
        for i in range(steps):  # the host only fills the queue
            idx = order[i * args.batch:(i + 1) * args.batch]
            feed.put((train_x[idx], train_y[idx]))
        params = epoch(params)
        epoch_losses = [float(losses.get()) for _ in tqdm(range(steps), desc=f"epoch {e + 1}", leave=False)]
        if device.platform == "ipu":
            ipu_seconds += jax_ipu.last_profile(device)["estimated_seconds"]["total"]
        acc = float(jax.jit(classifier["accuracy"])(params, test_x, test_y))
        print(f"epoch {e + 1}: loss {epoch_losses[-1]:.3f}, test accuracy {acc:.3f}")
    elapsed = time.perf_counter() - start
    print(f"{args.epochs * steps / elapsed:.1f} steps/s on {device.device_kind} (wall time)")
    if device.platform == "ipu":
        print(f"estimated IPU time per step {ipu_seconds / (args.epochs * steps) * 1e6:.1f} us "
              f"(host transfers of the feeds included)")
    return acc


if __name__ == "__main__":
    main()
