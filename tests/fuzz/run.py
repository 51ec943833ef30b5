"""Differential fuzzing of jax-ipu against XLA:CPU.

    python tests/fuzz/run.py --programs 5000 --seed 0 [--log fuzz.log]

runs programs seed, seed+1, ... (programs.generate), each on ipu and on
the CPU backend, compares them (compare.py) and minimises every failure to
a reproducer printed as Python source. pytest runs the same loop
(tests/ipu/user_programs/test_fuzz.py). Needs two ipu devices for the collective
programs (JAX_IPU_DEVICE_COUNT=2, which this script sets if unset)."""
from __future__ import annotations

import collections
import os
import sys
import time
import traceback

# (Its siblings compare, minimise and programs are imported from its own
# folder: the script's, or pytest's pythonpath.)
os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "2")

import jax  # noqa: E402

from compare import check  # noqa: E402
from minimise import minimise  # noqa: E402
from programs import generate, generate_sized  # noqa: E402

# The share of programs built at the sizes where the Model changes path
# (programs.generate_sized): whether seed s is one is a function of s.
SIZED_SHARE = 0.1


def program(seed: int, max_steps: int = 5, pmap_share: float = 0.08, sized_share: float = SIZED_SHARE):
    import numpy as np
    if np.random.default_rng([seed, 2]).random() < sized_share:
        return generate_sized(seed, max_steps=min(max_steps, 4))
    return generate(seed, max_steps=max_steps, pmap_share=pmap_share)


class Stats:
    def __init__(self):
        self.status = collections.Counter()
        self.families = collections.Counter()
        self.dtypes = collections.Counter()
        self.accepted = collections.Counter()
        self.ops = 0
        self.failures = []          # (seed, status, detail, reproducer)
        self.seconds = 0.0

    def summary(self) -> str:
        lines = [f"programs: {sum(self.status.values())} in {self.seconds:.0f} s, ops: {self.ops}",
                 "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.status.items())),
                 "accepted: " + (", ".join(f"{k} {v}" for k, v in sorted(self.accepted.items())) or "none"),
                 "op families: " + ", ".join(f"{k} {v}" for k, v in sorted(self.families.items())),
                 "dtypes of values: " + ", ".join(f"{k} {v}" for k, v in sorted(self.dtypes.items()))]
        return "\n".join(lines)


def fuzz(programs: int, seed: int = 0, log=None, minimise_failures: bool = True, max_steps: int = 5,
         sized_share: float = SIZED_SHARE) -> Stats:
    ipus, cpu = jax.devices("ipu")[:2], jax.devices("cpu")[0]
    stats = Stats()
    start = time.perf_counter()
    for s in range(seed, seed + programs):
        p = program(s, max_steps, 0.08 if len(ipus) >= 2 else 0.0, sized_share)
        if p is None:
            stats.status["not generated"] += 1
            continue
        stats.ops += len(p.lines)
        stats.families.update(p.families())
        stats.dtypes.update(str(v.dtype) for v in p.vars.values())
        try:
            outcome = check(p, ipus, cpu)
        except Exception:   # noqa: BLE001
            outcome = type("O", (), {"status": "harness_error", "detail": traceback.format_exc(), "accepted": ""})
        stats.status[outcome.status] += 1
        if outcome.status == "accepted":
            stats.accepted[outcome.accepted] += 1
        if outcome.status in ("mismatch", "ipu_error", "harness_error"):
            small = minimise(p, ipus, cpu, outcome.status) if minimise_failures and outcome.status != "harness_error" \
                else p
            small_outcome = check(small, ipus, cpu) if small is not p else outcome
            stats.failures.append((s, outcome.status, small_outcome.detail, small.reproducer()))
            if log:
                print(f"=== seed {s}: {outcome.status}: {small_outcome.detail}\n{small.reproducer()}", file=log,
                      flush=True)
        if log and (s - seed + 1) % 100 == 0:
            stats.seconds = time.perf_counter() - start
            print(f"--- {s - seed + 1} programs\n{stats.summary()}", file=log, flush=True)
    stats.seconds = time.perf_counter() - start
    return stats


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=int(os.environ.get("JAX_IPU_FUZZ_PROGRAMS", 1000)))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("JAX_IPU_FUZZ_SEED", 0)))
    parser.add_argument("--max-steps", type=int, default=5)
    parser.add_argument("--sized-share", type=float, default=SIZED_SHARE,
                        help="share of programs at the sizes where the Model changes path (1: only those)")
    parser.add_argument("--log", help="also write failures and progress to this file")
    args = parser.parse_args(argv)
    log = open(args.log, "a") if args.log else sys.stdout
    stats = fuzz(args.programs, args.seed, log=log, max_steps=args.max_steps, sized_share=args.sized_share)
    print(stats.summary(), file=log, flush=True)
    if log is not sys.stdout:
        print(stats.summary())
    return 1 if stats.failures else 0


if __name__ == "__main__":
    sys.exit(main())
