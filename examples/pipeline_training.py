"""Pipelined training over several IPUs with jax_ipu.pipeline (GPipe):
a deep residual MLP whose layers are split into stages, one stage per IPU;
each step runs the batch as micro-batches through the stages (fill,
steady state, drain), the backward pass runs the pipeline in reverse and
accumulates each stage's gradients over the micro-batches, then SGD
updates every stage's weights on its own IPU.

The same step runs on XLA:CPU (layers one after the other) for the losses
to compare with, and the IPU Model's estimate says where a step's time
goes: compute, on-chip exchange and sync, IPU-Link transfers between the
stages, and the pipeline bubble (stages idle while it fills and drains).

    python examples/pipeline_training.py [--stages 4] [--micro-batches 8] [--steps 5]
"""
import argparse
import os

os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

import jax_ipu  # noqa: E402
from jax_ipu import pipeline  # noqa: E402


def stage(params, h):
    """One pipeline stage: `layers` residual blocks (params stacked on axis 0)."""
    def block(h, p):
        w1, w2 = p
        return h + jnp.tanh(h @ w1) @ w2, None
    return jax.lax.scan(block, h, params)[0]


def init(stages: int, layers: int, width: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = (stages, layers, width, width)
    return ((rng.standard_normal(shape) * width ** -0.5).astype(np.float32),
            (rng.standard_normal(shape) * 0.1 * width ** -0.5).astype(np.float32))


def make_step(mesh, micro_batches: int, lr: float):
    def loss(params, x, y):
        out = pipeline.gpipe(stage, params, pipeline.microbatches(x, micro_batches), mesh=mesh)
        return jnp.mean((out - pipeline.microbatches(y, micro_batches)) ** 2)

    @jax.jit
    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), value
    return step


def reference_step(lr: float):
    @jax.jit
    def step(params, x, y):
        def loss(params):
            h = x
            for k in range(params[0].shape[0]):
                h = stage(jax.tree.map(lambda p, k=k: p[k], params), h)
            return jnp.mean((h - y) ** 2)
        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), value
    return step


def main(argv=None):
    ipus = jax.devices("ipu")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=min(4, len(ipus)))
    parser.add_argument("--layers", type=int, default=2, help="residual blocks per stage")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)
    if args.stages > len(ipus):
        parser.error(f"{args.stages} stages need {args.stages} IPUs; set JAX_IPU_DEVICE_COUNT={args.stages}")

    mesh = Mesh(np.array(ipus[:args.stages]), ("stage",))
    params = init(args.stages, args.layers, args.width)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    y = np.sin(x @ rng.standard_normal((args.width, args.width)).astype(np.float32) * args.width ** -0.5)

    step = make_step(mesh, args.micro_batches, args.lr)
    on_ipus = jax.device_put(params, NamedSharding(mesh, P("stage")))   # stage k's weights on IPU k
    xi, yi = jax.device_put((x, y), NamedSharding(mesh, P()))
    cpu = jax.devices("cpu")[0]
    ref, on_cpu = reference_step(args.lr), jax.device_put(params, cpu)
    xc, yc = jax.device_put((x, y), cpu)
    losses, cpu_losses = [], []
    for i in range(args.steps):
        on_ipus, loss = step(on_ipus, xi, yi)
        on_cpu, cpu_loss = ref(on_cpu, xc, yc)
        losses.append(float(loss))
        cpu_losses.append(float(cpu_loss))
        print(f"step {i}: loss {losses[-1]:.6f} (XLA:CPU {cpu_losses[-1]:.6f})")

    report = jax_ipu.last_profile(ipus[0])
    time = report["time_breakdown"]
    total = sum(time.values())
    clock = jax_ipu.target(ipus[0]).clock_hz
    bubble = pipeline.bubble_fraction(args.stages, args.micro_batches)
    staged = time["compute"] + time["exchange"] + time["sync"]
    print(f"{args.stages} stages x {args.layers} blocks of width {args.width}, batch {args.batch} in "
          f"{args.micro_batches} micro-batches: estimated {total / clock * 1e3:.3f} ms a step "
          f"({args.batch / (total / clock):,.0f} samples/s)")
    for kind in ("compute", "exchange", "sync", "ipu_link"):
        print(f"  {kind:9s} {time[kind] / clock * 1e6:9.1f} us  {100 * time[kind] / total:5.1f}%")
    print(f"  of which pipeline bubble (fill and drain, {args.stages - 1} of "
          f"{pipeline.ticks(args.stages, args.micro_batches)} ticks each way): "
          f"{bubble * staged / clock * 1e6:.1f} us, {100 * bubble * staged / total:.1f}% of the step")
    print(f"SRAM peak per IPU: {report['memory_stats']['peak'] / 2**20:.2f} MiB")
    return losses, cpu_losses, report


if __name__ == "__main__":
    main()
