"""Convolutional training on the IPU Model, as a ratio against XLA:CPU in
the same run.

    python benchmarks/cnn_training.py [--steps 10] [--json]

A small CNN on MNIST-shaped data (batch 32 of 28x28x1, NHWC): conv 3x3
(16) -> relu -> max pool 2x2 -> conv 3x3 (32) -> relu -> max pool 2x2 ->
dense 10, softmax cross-entropy, one hand-written Adam update. Its
gradient holds two select_and_scatter ops (the max pools' gradients)
besides the convolutions' gradients. Reports the wall time per step on
the IPU Model and on XLA:CPU of the same jitted step (parameters and
optimiser state donated) and their ratio, the same in process CPU time
(steadier on a shared machine), and the Model's estimated IPU time.
"""
import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_ipu

BATCH = 32
CHANNELS = (1, 16, 32)
DENSE_IN = 7 * 7 * CHANNELS[-1]
LEARNING_RATE, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8


def init(seed=0):
    rng = np.random.default_rng(seed)
    params = [(rng.standard_normal((3, 3, a, b)).astype(np.float32) * np.sqrt(2 / (9 * a)), np.zeros(b, np.float32))
              for a, b in zip(CHANNELS[:-1], CHANNELS[1:], strict=True)]
    params.append((rng.standard_normal((DENSE_IN, 10)).astype(np.float32) * np.sqrt(1 / DENSE_IN),
                   np.zeros(10, np.float32)))
    zeros = jax.tree.map(np.zeros_like, params)
    return params, (zeros, zeros, np.zeros((), np.float32))


def max_pool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def loss_fn(params, x, y):
    for w, b in params[:-1]:
        x = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        x = max_pool(jax.nn.relu(x + b))
    logits = x.reshape(x.shape[0], -1) @ params[-1][0] + params[-1][1]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 10), -1))


def step(params, opt, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    m, v, t = opt
    t = t + 1
    m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, grads)
    v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, grads)
    scale = LEARNING_RATE * jnp.sqrt(1 - B2 ** t) / (1 - B1 ** t)
    params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + EPS), params, m, v)
    return params, (m, v, t), loss


def batches(n, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, 28, 28, 1)).astype(np.float32),
             rng.integers(0, 10, BATCH).astype(np.int32)) for _ in range(n)]


def seconds_per_step(device, steps: int) -> tuple[float, float]:
    """(wall time, process CPU time) per step, medians of three passes: CPU
    time shows the work done when other processes share the cores."""
    f = jax.jit(step, donate_argnums=(0, 1))
    data = [jax.device_put(b, device) for b in batches(steps)]
    params, opt = jax.device_put(init(), device)
    params, opt, _ = f(params, opt, *data[0])
    jax.block_until_ready(params)
    wall, cpu = [], []
    for _ in range(3):
        start, start_cpu = time.perf_counter(), time.process_time()
        for x, y in data:
            params, opt, loss = f(params, opt, x, y)
        jax.block_until_ready(params)
        wall.append((time.perf_counter() - start) / steps)
        cpu.append((time.process_time() - start_cpu) / steps)
    return statistics.median(wall), statistics.median(cpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print only the results as one JSON object")
    args = parser.parse_args()
    ipu, cpu = jax.devices("ipu")[0], jax.devices("cpu")[0]
    t_cpu, c_cpu = seconds_per_step(cpu, args.steps)
    t_ipu, c_ipu = seconds_per_step(ipu, args.steps)
    params, opt = jax.device_put(init(), ipu)
    compiled = jax.jit(step).lower(params, opt, *batches(1)[0]).compile()
    est = jax_ipu.estimated_seconds(compiled.cost_analysis()["estimated_cycles"], ipu)
    result = {"cpu_ms_per_step": t_cpu * 1e3, "ipu_model_ms_per_step": t_ipu * 1e3,
              "ratio_ipu_model_over_cpu": t_ipu / t_cpu, "cpu_process_ms_per_step": c_cpu * 1e3,
              "ipu_model_process_ms_per_step": c_ipu * 1e3, "process_time_ratio": c_ipu / c_cpu,
              "estimated_ipu_us_per_step": est * 1e6}
    if args.json:
        print(json.dumps(result))
        return
    print(f"CNN conv3x3({CHANNELS[1]})-pool-conv3x3({CHANNELS[2]})-pool-dense10, batch {BATCH} of 28x28x1, "
          f"Adam, {args.steps} steps")
    print(f"  wall time per step: XLA:CPU {t_cpu * 1e3:.2f} ms, IPU Model {t_ipu * 1e3:.2f} ms, "
          f"ratio {t_ipu / t_cpu:.2f}x")
    print(f"  process CPU time per step: XLA:CPU {c_cpu * 1e3:.2f} ms, IPU Model {c_ipu * 1e3:.2f} ms, "
          f"ratio {c_ipu / c_cpu:.2f}x")
    print(f"  estimated IPU time per step: {est * 1e6:.1f} us (host transfers excluded)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
