"""Compile once: the time to compile a training step for the IPU against
the time to load it from the executable cache, and the entry's size.

    python benchmarks/compile_cache.py [--programs mlp resnet18 resnet50] [--json]

Each program runs in two fresh processes sharing an empty cache directory
(JAX_IPU_EXECUTABLE_CACHE): the first compiles it and stores the entry,
the second finds it and loads it. Both time `lowered.compile()` (tracing
and lowering are JAX's and the same in both), and the second runs one step
to check the loaded program's result against the first's. Programs:

    mlp       MNIST MLP step: 784-512-512-10, batch 128, SGD
    resnet18  ResNet-18-style CIFAR step: 8 residual blocks (32-256 channels),
              batch norm, batch 32, SGD with momentum (flax, optax)
    resnet50  ResNet-50 (flax, bottleneck blocks 3-4-6-3, batch norm), 224x224,
              batch 2, SGD with momentum; compiled with allow_out_of_memory
              (it does not fit one IPU yet), 30-70 s to compile

Goals: loading under 1 s and under 5% of the compile time. Wall times
and process CPU times (all threads) are both reported: on a shared machine
the CPU times are the steadier figures.
"""
import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time


def mlp():
    """benchmarks/training.py's MNIST MLP step, parameters donated."""
    import jax
    import training

    x, y = training.batches(1)[0]
    return jax.jit(training.step, donate_argnums=0), (training.init(), x, y)


def resnet(kind: str):
    """The ResNet-18-style CIFAR step (batch 32) or ResNet-50's (float32,
    batch 2), from models_zoo."""
    import jax.numpy as jnp
    import models_zoo

    if kind == "resnet18":
        return models_zoo.cifar_resnet18_train(32)
    return models_zoo.resnet50_train(2, jnp.float32)


PROGRAMS = {"mlp": mlp, "resnet18": functools.partial(resnet, "resnet18"),
            "resnet50": functools.partial(resnet, "resnet50")}


def child(name: str) -> dict:
    import jax
    import numpy as np

    from jax_ipu.pjrt import client

    step, args = PROGRAMS[name]()
    ipu = jax.devices("ipu")[0]
    inside = []           # seconds in the plugin's compile call (a cache hit: the load)
    original = client.Client.compile

    def timed(self, *a):
        start = time.perf_counter()
        try:
            return original(self, *a)
        finally:
            inside.append(time.perf_counter() - start)
    client.Client.compile = timed
    args = jax.device_put(args, ipu)
    lowered = step.lower(*args)
    start, start_cpu = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    outputs = jax.tree.leaves(compiled(*args))
    loss = float(np.asarray(outputs[-1]))
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "plugin_seconds": sum(inside), "loss": loss, "stats": client.CURRENT.cache.stats,
            "estimated_cycles": compiled.cost_analysis()["estimated_cycles"]}


def measure(name: str) -> dict:
    directory = tempfile.mkdtemp(prefix="jax-ipu-cache-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_IPU", "TF_POPLAR"))}
    env["JAX_IPU_EXECUTABLE_CACHE"] = directory
    if name == "resnet50":
        env["JAX_IPU_ALLOW_OUT_OF_MEMORY"] = "1"
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"{name}: {out.stderr[-3000:]}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    entries = [os.path.join(directory, f) for f in os.listdir(directory)]
    size = sum(os.path.getsize(f) for f in entries)
    first, second = runs
    assert first["stats"]["stored"] == 1 and second["stats"]["hits"] == 1, runs
    assert first["loss"] == second["loss"] and first["estimated_cycles"] == second["estimated_cycles"], runs
    for f in entries:
        os.unlink(f)
    os.rmdir(directory)
    return {"compile_s": first["seconds"], "load_s": second["seconds"], "plugin_load_s": second["plugin_seconds"],
            "compile_cpu_s": first["cpu_seconds"], "load_cpu_s": second["cpu_seconds"],
            "load_share_of_compile": second["seconds"] / first["seconds"],
            "load_share_of_compile_cpu": second["cpu_seconds"] / first["cpu_seconds"], "entry_bytes": size,
            "loss": first["loss"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", nargs="+", choices=list(PROGRAMS), default=["mlp", "resnet18"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=list(PROGRAMS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    results = {}
    for name in args.programs:
        r = results[name] = measure(name)
        print(f"{name}: compile {r['compile_s']:.2f} s (CPU {r['compile_cpu_s']:.2f} s), load from the cache "
              f"{r['load_s']:.3f} s (CPU {r['load_cpu_s']:.3f} s; in the plugin {r['plugin_load_s']:.3f} s): "
              f"{100 * r['load_share_of_compile']:.1f}% of compile ({100 * r['load_share_of_compile_cpu']:.1f}% "
              f"in CPU time), entry {r['entry_bytes'] / 1e6:.2f} MB; "
              f"goals: load < 1 s {'met' if r['load_s'] < 1 else 'MISSED'}, "
              f"< 5% of compile {'met' if r['load_share_of_compile'] < 0.05 else 'MISSED'}", flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
