"""Training on the IPU Model, as ratios against references in the same run.

    python benchmarks/training.py [--steps 30] [--rounds 9]

1. Host-link bytes per step of an MNIST-shaped MLP (784-512-512-10, batch
   128) with and without donating the parameters, and the IPU memory the
   state takes: with donation only the batch moves and the state is held
   once; without it the state also stays on the IPU (PJRT outputs live on
   the device) but each step holds two copies of it.
2. Wall time per training step on the IPU Model against XLA:CPU on the same
   jitted step (goal: at most 1.5x), and the Model's estimated IPU time.
"""
import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_ipu

SIZES = [784, 512, 512, 10]
BATCH = 128


def init(seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((a, b)).astype(np.float32) * np.sqrt(2 / a), np.zeros(b, np.float32))
            for a, b in zip(SIZES[:-1], SIZES[1:], strict=True)]


def loss_fn(params, x, y):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    logits = x @ params[-1][0] + params[-1][1]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 10), -1))


def step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


def batches(n, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, 784)).astype(np.float32), rng.integers(0, 10, BATCH).astype(np.int32))
            for _ in range(n)]


def host_bytes_and_peak_memory(ipu, donate: bool, steps: int) -> tuple[float, int]:
    """Host-link bytes per step, and the most IPU memory in use after a step."""
    f = jax.jit(step, donate_argnums=0 if donate else ())
    data = batches(steps)
    params, _ = f(jax.device_put(init(), ipu), *data[0])
    jax.block_until_ready(params)
    before, peak = jax_ipu.transfer_stats(ipu), 0
    for x, y in data:
        new_params, loss = f(params, x, y)
        jax.block_until_ready(new_params)
        peak = max(peak, ipu.memory_stats()["bytes_in_use"])
        params = new_params
    after = jax_ipu.transfer_stats(ipu)
    return sum(after[k] - before[k] for k in after) / steps, peak


def seconds_per_step(devices, steps: int, rounds: int) -> list[list[float]]:
    """Wall seconds per step of the same jitted, donating step on each
    device: `rounds` blocks of `steps` steps, the devices taking turns
    (first device first in even rounds, last first in odd ones), so that a
    change in the host's load falls on both."""
    states = []
    for device in devices:
        f = jax.jit(step, donate_argnums=0)
        data = [jax.device_put(b, device) for b in batches(steps)]
        params, _ = f(jax.device_put(init(), device), *data[0])
        jax.block_until_ready(params)
        states.append([f, data, params])
    samples = [[] for _ in devices]
    for r in range(rounds):
        order = range(len(devices)) if r % 2 == 0 else reversed(range(len(devices)))
        for i in order:
            f, data, params = states[i]
            start = time.perf_counter()
            for x, y in data:
                params, loss = f(params, x, y)
            jax.block_until_ready(params)
            samples[i].append((time.perf_counter() - start) / steps)
            states[i][2] = params
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=9, help="alternating timed blocks per device")
    args = parser.parse_args()
    ipu, cpu = jax.devices("ipu")[0], jax.devices("cpu")[0]
    donated, donated_peak = host_bytes_and_peak_memory(ipu, True, args.steps)
    kept, kept_peak = host_bytes_and_peak_memory(ipu, False, args.steps)
    batch_bytes = BATCH * 784 * 4 + BATCH * 4
    s_cpu, s_ipu = seconds_per_step([cpu, ipu], args.steps, args.rounds)
    t_cpu, t_ipu = statistics.median(s_cpu), statistics.median(s_ipu)
    # Each round's IPU block against the CPU block next to it.
    paired = sorted(i / c for i, c in zip(s_ipu, s_cpu, strict=True))
    compiled = jax.jit(step, donate_argnums=0).lower(jax.device_put(init(), ipu), *batches(1)[0]).compile()
    est = jax_ipu.estimated_seconds(compiled.cost_analysis()["estimated_cycles"], ipu)
    result = {"host_bytes_per_step_donated": donated, "host_bytes_per_step_not_donated": kept,
              "ipu_bytes_in_use_donated": donated_peak, "ipu_bytes_in_use_not_donated": kept_peak,
              "batch_bytes": batch_bytes, "cpu_ms_per_step": t_cpu * 1e3, "ipu_model_ms_per_step": t_ipu * 1e3,
              "ratio_ipu_model_over_cpu": t_ipu / t_cpu, "ratio_per_round": paired,
              "estimated_ipu_us_per_step": est * 1e6}
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, {args.steps} steps")
    print(f"  host-link bytes per step: donated {donated:,.0f}, not donated {kept:,.0f} "
          f"(one batch is {batch_bytes:,})")
    print(f"  IPU memory in use after a step: donated {donated_peak:,} B, not donated {kept_peak:,} B "
          f"({kept_peak / donated_peak:.2f}x)")
    print(f"  wall time per step: XLA:CPU {t_cpu * 1e3:.2f} ms, IPU Model {t_ipu * 1e3:.2f} ms, "
          f"ratio {t_ipu / t_cpu:.2f}x (goal <= 1.5x; medians of {args.rounds} alternating blocks)")
    print(f"  ratio per round: {paired[0]:.2f}x to {paired[-1]:.2f}x, median {statistics.median(paired):.2f}x")
    print(f"  estimated IPU time per step: {est * 1e6:.1f} us (host transfers excluded)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
