"""Wall time of the IPU Model against XLA:CPU on the same jitted programs,
inputs already on each device, in one run:

  elementwise  a fused chain with transcendentals on f32[1M]
  matmul       f32[1024,1024] @ f32[1024,1024]
  mlp_fwd      784-512-512-10 MLP forward, batch 128, f32
  mlp_fwd_bwd  its loss and gradients (value_and_grad)

    python benchmarks/compiler_vs_cpu.py [--repeats 20] [--json FILE]

Goal (issue 3): the IPU Model's wall time at most 2x XLA:CPU's.
"""
import argparse
import itertools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def elementwise(x):
    return jnp.tanh(x * 1.5 + 0.25) * jnp.exp(-x * x) + jnp.maximum(x, 0.0)


def matmul(a, b):
    return a @ b


def mlp(params, x):
    (w1, b1), (w2, b2), (w3, b3) = params
    h = jnp.tanh(x @ w1 + b1)
    h = jnp.tanh(h @ w2 + b2)
    return h @ w3 + b3


def mlp_loss(params, x, y):
    logits = mlp(params, x)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))


def cases():
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    sizes = [784, 512, 512, 10]
    params = [(f32(m, n) * np.float32(m ** -0.5), f32(n) * 0) for m, n in itertools.pairwise(sizes)]
    x, y = f32(128, 784), np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)]
    return {
        "elementwise": (elementwise, (f32(1 << 20),)),
        "matmul": (matmul, (f32(1024, 1024), f32(1024, 1024))),
        "mlp_fwd": (mlp, (params, x)),
        "mlp_fwd_bwd": (jax.value_and_grad(mlp_loss), (params, x, y)),
    }


WARM_UP = 10


def seconds_per_call(f, args, device, repeats: int) -> float:
    f = jax.jit(f)
    args = jax.device_put(args, device)
    # Compile, then warm up both backends alike: just after the other backend
    # ran, the first calls take up to twice as long (its threads still spin).
    for _ in range(WARM_UP):
        jax.block_until_ready(f(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    cpu, ipu = jax.devices("cpu")[0], jax.devices("ipu")[0]
    results = {}
    print(f"{'program':<12} {'cpu ms':>9} {'ipu ms':>9} {'ratio':>7}   (median of {args.repeats}; goal <= 2x)")
    for name, (f, inputs) in cases().items():
        c = seconds_per_call(f, inputs, cpu, args.repeats)
        i = seconds_per_call(f, inputs, ipu, args.repeats)
        results[name] = {"cpu_ms": c * 1e3, "ipu_ms": i * 1e3, "ratio_ipu_over_cpu": i / c}
        print(f"{name:<12} {c * 1e3:9.3f} {i * 1e3:9.3f} {i / c:6.2f}x")
    print(json.dumps(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
