"""Per-call dispatch overhead: jit(lambda x: x*2+1) on float32[4], input
already on the device, IPU Model against XLA:CPU in the same run.

    python benchmarks/dispatch.py [--calls 20000]

Goal (issue 2): the IPU's time per call at most 3x the CPU backend's.
"""
import argparse
import json
import statistics
import time

import jax
import numpy as np


def per_call_seconds(device, calls: int, repeats: int = 5) -> float:
    f = jax.jit(lambda x: x * 2 + 1)
    x = jax.device_put(np.arange(4, dtype=np.float32), device)
    f(x).block_until_ready()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            y = f(x)
        y.block_until_ready()
        pipelined = (time.perf_counter() - start) / calls
        start = time.perf_counter()
        for _ in range(calls // 4):
            f(x).block_until_ready()
        synced = (time.perf_counter() - start) / (calls // 4)
        samples.append((pipelined, synced))
    return (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    cpu = per_call_seconds(jax.devices("cpu")[0], args.calls)
    ipu = per_call_seconds(jax.devices("ipu")[0], args.calls)
    result = {
        "cpu_us_per_call": cpu[0] * 1e6, "ipu_us_per_call": ipu[0] * 1e6,
        "ratio_ipu_over_cpu": ipu[0] / cpu[0],
        "cpu_us_per_synced_call": cpu[1] * 1e6, "ipu_us_per_synced_call": ipu[1] * 1e6,
        "ratio_synced": ipu[1] / cpu[1],
    }
    print(f"dispatch of jit(x*2+1) on f32[4], input on device ({args.calls} calls, median of 5)")
    print(f"  back-to-back calls : cpu {result['cpu_us_per_call']:7.1f} us  ipu {result['ipu_us_per_call']:7.1f} us"
          f"  ratio {result['ratio_ipu_over_cpu']:.2f}x (goal <= 3x)")
    print(f"  each call synced   : cpu {result['cpu_us_per_synced_call']:7.1f} us  ipu {result['ipu_us_per_synced_call']:7.1f} us"
          f"  ratio {result['ratio_synced']:.2f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
