"""Soak: long runs of the things a training job repeats, with the process's
resident memory (RSS) sampled over time, on ipu and on XLA:CPU in the same
run (one backend after the other; RSS is the process's).

    python benchmarks/soak.py [--quick] [--calls 100000] [--threads 4] [--programs 500]

Phases, each on each backend:
- donated: `calls` calls of a jitted update donating its state (f32[256]),
  the state never leaving the device;
- threads: `threads` Python threads each making calls/20 calls of their own
  jitted programs, with a host transfer each way every 10 calls;
- programs: `programs` distinct programs compiled, run once and dropped.

Each backend first runs a little of each phase, so that one-time costs
(code first run, caches) are not counted as growth. Reported: RSS (MB) sampled every tenth of each phase, each phase's growth
from its start to its end (after a gc), the IPU's bytes_in_use after each
phase (back to what it was: nothing held), and the growth of ipu against
XLA:CPU. A leak shows as RSS climbing with the count, sample after sample;
a one-time cost (code, caches) as a step at the start. --quick runs 5,000
calls, 2 threads and 50 programs.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 2**20


class Samples:
    def __init__(self, total: int):
        self.every = max(total // 10, 1)
        self.points: list[tuple[int, float, float]] = []    # (count, seconds, RSS MB)
        self.start = time.perf_counter()

    def tick(self, count: int) -> None:
        if count % self.every == 0:
            self.points.append((count, time.perf_counter() - self.start, rss_mb()))


def donated(device, calls: int) -> Samples:
    step = jax.jit(lambda s, x: (s * 0.999 + x, jnp.sum(s)), donate_argnums=0)
    state = jax.device_put(np.zeros(256, np.float32), device)
    x = jax.device_put(np.ones(256, np.float32), device)
    samples = Samples(calls)
    for i in range(1, calls + 1):
        state, loss = step(state, x)
        samples.tick(i)
    jax.block_until_ready(state)
    return samples


def threads(device, calls: int, count: int) -> Samples:
    per_thread = max(calls // 20, 1)
    samples = Samples(per_thread * count)
    done = [0]
    lock = threading.Lock()
    errors = []

    def work(k: int) -> None:
        try:
            f = jax.jit(lambda v: jnp.tanh(v * (k + 1)) + k)
            v = jax.device_put(np.full(64, k, np.float32), device)
            for i in range(per_thread):
                v = f(v)
                if i % 10 == 0:
                    v = jax.device_put(np.asarray(v), device)
                with lock:
                    done[0] += 1
                    samples.tick(done[0])
            jax.block_until_ready(v)
        except Exception as e:   # noqa: BLE001 (reported below)
            errors.append(e)
    pool = [threading.Thread(target=work, args=(k,)) for k in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return samples


def programs(device, count: int) -> Samples:
    samples = Samples(count)
    x = jax.device_put(np.arange(32, dtype=np.float32), device)
    for i in range(1, count + 1):
        c = float(i)
        f = jax.jit(lambda v, c=c: jnp.tanh(v * c)[::2] + jnp.max(v) - c)   # a new program each time
        np.asarray(f(x))
        del f
        samples.tick(i)
    jax.clear_caches()
    return samples


def soak(device, args) -> dict:
    out = {}
    phases = [("donated", lambda: donated(device, args.calls)),
              ("threads", lambda: threads(device, args.calls, args.threads)),
              ("programs", lambda: programs(device, args.programs))]
    # One-time costs (code paths first taken, caches) before measuring.
    donated(device, 500), threads(device, 2000, 1), programs(device, 5)
    for name, run in phases:
        gc.collect()
        before = rss_mb()
        start = time.perf_counter()
        samples = run()
        gc.collect()
        after = rss_mb()
        stats = device.memory_stats() if device.platform == "ipu" else {}
        out[name] = {"seconds": time.perf_counter() - start, "rss_start_mb": before, "rss_end_mb": after,
                     "growth_mb": after - before, "samples": samples.points,
                     "bytes_in_use": stats.get("bytes_in_use")}
        line = " ".join(f"{rss:.0f}" for _, _, rss in samples.points)
        print(f"  {device.platform:3s} {name:8s} {out[name]['seconds']:6.1f} s  RSS {before:.0f} -> {after:.0f} MB "
              f"({after - before:+.1f})  samples: {line}"
              + (f"  bytes_in_use {stats['bytes_in_use']}" if stats else ""), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 calls, 2 threads, 50 programs")
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--programs", type=int, default=500)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.threads, args.programs = 5000, 2, 50
    print(f"soak: {args.calls} donated calls, {args.threads} threads x {max(args.calls // 20, 1)} calls, "
          f"{args.programs} programs; RSS {rss_mb():.0f} MB at start")
    ipu = jax.devices("ipu")[0]
    in_use = ipu.memory_stats()["bytes_in_use"]
    result = {"cpu": soak(jax.devices("cpu")[0], args), "ipu": soak(ipu, args), "ipu_bytes_in_use_before": in_use}
    for name in ("donated", "threads", "programs"):
        c, i = result["cpu"][name], result["ipu"][name]
        print(f"{name:8s}: RSS growth ipu {i['growth_mb']:+.1f} MB, cpu {c['growth_mb']:+.1f} MB; "
              f"time ipu/cpu {i['seconds'] / c['seconds']:.2f}x")
    print(f"ipu bytes_in_use: {in_use} before, {result['ipu']['programs']['bytes_in_use']} after")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
