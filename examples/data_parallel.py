"""Data-parallel training over the IPUs of several processes, as poprun ran
Graphcore's jobs: one process per instance, each driving its own IPUs, the
gradient all-reduce across all of them.

    mpirun -n 2 python examples/data_parallel.py              # 2 processes x 2 IPUs
    python examples/data_parallel.py --coordinator 127.0.0.1:4321 \\
        --num-processes 2 --process-id 0                       # terminal 1 (then 1 in terminal 2)
    JAX_IPU_DEVICE_COUNT=4 python examples/data_parallel.py   # 1 process x 4 IPUs: the same losses

Each process models JAX_IPU_DEVICE_COUNT IPUs (2 unless set); the batch
is split over all IPUs of all processes (a NamedSharding over one global
mesh), each process feeds only its own rows, and jit's partitioner adds
the gradient all-reduce, which runs between processes over Gloo. Process
0 prints the losses and the estimated time of a step on the IPUs.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "2")
os.environ.setdefault("JAX_PLATFORMS", "ipu,cpu")   # the CPU backend carries collectives between processes

import jax  # noqa: E402


def main(argv=None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", help="host:port of process 0 (without it: mpirun's or one process)")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="global batch, split over all IPUs")
    args = parser.parse_args(argv)
    if args.coordinator:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    elif "OMPI_COMM_WORLD_SIZE" in os.environ or "SLURM_NTASKS" in os.environ:
        jax.distributed.initialize()            # mpirun / srun: JAX reads rank and size itself

    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_ipu

    ipus = jax.devices("ipu")
    mesh = Mesh(np.array(ipus), ("data",))
    batch_rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    me = jax.process_index()
    if me == 0:
        print(f"{jax.process_count()} process(es) x {jax.local_device_count('ipu')} IPUs = {len(ipus)} IPUs")

    # The same data and initial weights in every process (seeded); each
    # process places only its own rows of every batch.
    rng = np.random.default_rng(0)
    sizes = [32, 64, 64, 10]
    params = [((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), np.zeros(b, np.float32))
              for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    params = jax.device_put(params, replicated)
    teacher = rng.standard_normal((32, 10)).astype(np.float32)

    def loss_fn(params, x, labels):
        for w, b in params[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = params[-1]
        logits = x @ w + b
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
        return -jnp.mean(picked)

    @jax.jit
    def step(params, x, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        return jax.tree.map(lambda p, g: p - 0.5 * g, params, grads), loss

    def place(global_rows):
        index = batch_rows.addressable_devices_indices_map(global_rows.shape)
        mine = sorted({s[0].start or 0 for s in index.values()})
        per = global_rows.shape[0] // len(ipus)
        local = np.concatenate([global_rows[r:r + per] for r in mine])
        return jax.make_array_from_process_local_data(batch_rows, local, global_rows.shape)

    losses = []
    for _ in range(args.steps):
        x = rng.standard_normal((args.batch, 32)).astype(np.float32)
        labels = np.argmax(x @ teacher, axis=1).astype(np.int32)
        params, loss = step(params, place(x), place(labels))
        losses.append(float(loss.addressable_data(0)))
    if me == 0:
        print("losses:", " ".join(f"{v:.7f}" for v in losses))
        report = jax_ipu.last_profile(jax.local_devices(backend="ipu")[0])
        parts = ", ".join(f"{k} {v / report['target']['clock_hz'] * 1e6:.1f} us"
                          for k, v in report["time_breakdown"].items() if v)
        print(f"estimated IPU time per step: {report['estimated_seconds']['device'] * 1e3:.3f} ms ({parts})")
    return losses


if __name__ == "__main__":
    main()
