"""Data-parallel training on 1, 2 and 4 modelled IPUs: one SGD step of a
784-512-512-10 MLP (f32) on a global batch split over the IPUs with
jax.pmap, gradients averaged with pmean (an all_reduce over the IPU-Links).

Per IPU count: wall time of the simulation per step (median), the
estimated IPU time per step (the cycle estimate at the target's clock),
and the share of that estimate spent in collectives (link transfer,
latency and the sync across IPUs).

    python benchmarks/multi_ipu.py [--batch 512] [--repeats 10] [--json FILE]
"""
import argparse
import itertools
import json
import os
import statistics
import time

os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_ipu  # noqa: E402
from jax_ipu.compiler.lowering.collectives import collective_cycles  # noqa: E402


def loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jnp.tanh(h @ w + b)
    w, b = params[-1]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(h @ w + b) * y, axis=-1))


def step(params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    grads = jax.lax.pmean(grads, "batch")
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), jax.lax.pmean(value, "batch")


def measure(n: int, batch: int, repeats: int) -> dict:
    from jax_ipu.pjrt import client
    devices = jax.devices("ipu")[:n]
    rng = np.random.default_rng(0)
    sizes = [784, 512, 512, 10]
    params = [(rng.standard_normal((m, k)).astype(np.float32) * np.float32(m ** -0.5), np.zeros(k, np.float32))
              for m, k in itertools.pairwise(sizes)]
    x = rng.standard_normal((n, batch // n, 784)).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, (n, batch // n))]
    # Inputs on the devices once, split along the leading (per-IPU) axis.
    split = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("batch",)),
                                       jax.sharding.PartitionSpec("batch"))
    replicated = jax.device_put(jax.tree.map(lambda p: np.stack([p] * n), params), split)
    x, y = jax.device_put((x, y), split)
    f = jax.pmap(step, axis_name="batch", devices=devices)
    jax.block_until_ready(f(replicated, x, y))          # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(replicated, x, y))
        times.append(time.perf_counter() - start)
    program = client.CURRENT.device(devices[0].id).last_program
    cycles, collective = program.cycles, collective_cycles(program)
    return {"ipus": n, "batch_per_ipu": batch // n, "wall_ms": 1e3 * statistics.median(times),
            "ipu_ms": 1e3 * jax_ipu.estimated_seconds(cycles, devices[0]),
            "collective_ms": 1e3 * jax_ipu.estimated_seconds(collective, devices[0]),
            "collective_share": collective / cycles if cycles else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [measure(n, args.batch, args.repeats) for n in (1, 2, 4)]
    print(f"MLP 784-512-512-10 training step, global batch {args.batch}, {jax_ipu.target().describe()}")
    print(f"{'IPUs':>4} {'batch/IPU':>9} {'wall ms':>9} {'IPU ms':>8} {'collective ms':>13} {'share':>6}")
    for r in rows:
        print(f"{r['ipus']:>4} {r['batch_per_ipu']:>9} {r['wall_ms']:>9.1f} {r['ipu_ms']:>8.3f} "
              f"{r['collective_ms']:>13.3f} {100 * r['collective_share']:>5.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
