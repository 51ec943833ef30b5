"""On-device training loop fed by infeed/outfeed queues against a Python
loop of jitted steps, on the IPU Model, in one run.

    python benchmarks/feeds_loop.py [--steps 50]

Reports wall time per step of each (what the simulation costs here; the
Python loop both reading each loss and reading them only at the end) and
the Model's estimated IPU time per step (what an IPU would take, host
transfers included), for an MNIST-shaped MLP (784-512-512-10, batch 128).
"""
import argparse
import functools
import json
import pathlib
import runpy
import time

import jax
import jax.numpy as jnp
from jax import lax

import jax_ipu

training = runpy.run_path(str(pathlib.Path(__file__).with_name("training.py")))


def python_loop(ipu, data, read_each_loss=True):
    step = jax.jit(training["step"], donate_argnums=0)
    params = jax.device_put(training["init"](), ipu)
    params, loss = step(params, *data[0])  # compile
    jax.block_until_ready(params)
    start, losses = time.perf_counter(), []
    for x, y in data:
        params, loss = step(params, x, y)
        if read_each_loss:
            float(loss)  # the host reads each loss (a sync per step), as many training loops do
        else:
            losses.append(loss)   # read at the end: steps are dispatched ahead
    jax.block_until_ready((params, losses))
    wall = (time.perf_counter() - start) / len(data)
    # Every step runs the same program with the same transfers.
    return wall, jax_ipu.last_profile(ipu)["estimated_seconds"]["total"]


def device_loop(ipu, data):
    spec = (jax.ShapeDtypeStruct(data[0][0].shape, jnp.float32), jax.ShapeDtypeStruct(data[0][1].shape, jnp.int32))
    feed, losses = jax_ipu.InfeedQueue(spec), jax_ipu.OutfeedQueue()

    @functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
    def run(params, steps):
        def body(i, params):
            params, loss = training["step"](params, *jax_ipu.infeed(feed))
            jax_ipu.outfeed(losses, loss)
            return params
        return lax.fori_loop(0, steps, body, params)

    params = jax.device_put(training["init"](), ipu)
    for b in data:
        feed.put(b)
    params = run(params, len(data))  # the first call compiles
    jax.block_until_ready(params)
    list(losses)
    for b in data:
        feed.put(b)
    start = time.perf_counter()
    params = run(params, len(data))
    jax.block_until_ready(params)
    wall = (time.perf_counter() - start) / len(data)
    assert len(list(losses)) == len(data)
    return wall, jax_ipu.last_profile(ipu)["estimated_seconds"]["total"] / len(data)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    ipu = jax.devices("ipu")[0]
    data = training["batches"](args.steps)
    py_wall, py_ipu = python_loop(ipu, data)
    ahead_wall, _ = python_loop(ipu, data, read_each_loss=False)
    dev_wall, dev_ipu = device_loop(ipu, data)
    result = {"python_loop_ms_per_step": py_wall * 1e3, "device_loop_ms_per_step": dev_wall * 1e3,
              "wall_ratio_device_over_python": dev_wall / py_wall,
              "python_loop_reading_losses_at_the_end_ms_per_step": ahead_wall * 1e3,
              "wall_ratio_device_over_python_reading_at_the_end": dev_wall / ahead_wall,
              "python_loop_estimated_ipu_us_per_step": py_ipu * 1e6,
              "device_loop_estimated_ipu_us_per_step": dev_ipu * 1e6}
    print(f"MLP 784-512-512-10, batch 128, {args.steps} steps on the IPU Model")
    print(f"  wall time per step: Python loop {py_wall * 1e3:.2f} ms, on-device loop with feeds "
          f"{dev_wall * 1e3:.2f} ms (ratio {dev_wall / py_wall:.2f})")
    print(f"  Python loop reading the losses only at the end (steps dispatched ahead): {ahead_wall * 1e3:.2f} ms "
          f"(on-device loop / this: {dev_wall / ahead_wall:.2f})")
    print(f"  estimated IPU time per step: Python loop {py_ipu * 1e6:.1f} us, on-device loop {dev_ipu * 1e6:.1f} us")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
