"""Host memory and time of compiling a ResNet-18-style CIFAR training step,
IPU against XLA:CPU, each compiled in a fresh process:

    python benchmarks/compile_footprint.py [--batch 32] [--json]

The step: 3x3 convolutions in 8 residual blocks (32 to 256 channels) with
batch norm, softmax cross-entropy, optax SGD with momentum; parameters,
batch statistics and optimiser state donated. Reports, per backend, the
compile wall time, the peak host memory the compile added (ru_maxrss
after it, less the resident size before it) and the resident size it
leaves (the compiled program held for running), and the IPU/CPU ratios.
A researcher's laptop is the budget: on 2026-11-24 this step's IPU compile
peaked at 8.7 GB, before the compiler dropped its per-element caches and
gather views kept one index array each.
"""
import argparse
import json
import resource
import subprocess
import sys
import time


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def child(platform: str, batch: int) -> dict:
    import jax
    import models_zoo

    step, host_args = models_zoo.cifar_resnet18_train(batch)
    device = jax.devices(platform)[0]
    args = jax.device_put(host_args, device)
    lowered = step.lower(*args)
    before = resident_bytes()
    start = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    after = resident_bytes()
    del compiled
    return {"compile_s": seconds, "peak_added_bytes": max(peak - before, 0), "resident_added_bytes": after - before}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=["cpu", "ipu"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch)))
        return
    results = {}
    for platform in ("cpu", "ipu"):
        out = subprocess.run([sys.executable, __file__, "--child", platform, "--batch", str(args.batch)],
                             capture_output=True, text=True, check=True)
        results[platform] = json.loads(out.stdout.strip().splitlines()[-1])
    cpu, ipu = results["cpu"], results["ipu"]
    gb = 1e9
    print(f"ResNet-18-style CIFAR training step, batch {args.batch}: compile in a fresh process")
    for name, r in results.items():
        print(f"  {name}: {r['compile_s']:.1f} s, peak +{r['peak_added_bytes'] / gb:.2f} GB, "
              f"resident after +{r['resident_added_bytes'] / gb:.2f} GB")
    summary = {"batch": args.batch, "cpu": cpu, "ipu": ipu,
               "compile_time_ratio": ipu["compile_s"] / cpu["compile_s"],
               "peak_memory_ratio": ipu["peak_added_bytes"] / max(cpu["peak_added_bytes"], 1)}
    print(f"  ratios ipu/cpu: compile time {summary['compile_time_ratio']:.1f}x, "
          f"peak memory {summary['peak_memory_ratio']:.1f}x")
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
