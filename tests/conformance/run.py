#!/usr/bin/env python
"""Runs JAX's own test suite with `ipu` as the platform and reports the
pass rate per test file, failures sorted into buckets. JAX_PLATFORMS is
ipu,cpu: ipu is JAX's default backend, so the tests' device under test,
and cpu is there for what JAX runs on it (host callbacks, jax.debug.print).

    python tests/conformance/run.py --jax-src /path/to/jax [--files lax_test ...]

--jax-src is a checkout of jax at the commit matching the installed jax
(8e784c546d for 0.10.2); nothing is downloaded. Each file runs under
pytest-xdist with worker restarts, so a crash costs one test, not the run.
Artifacts go to --out (default conformance-report/): junit XML per file,
one text file per failure, buckets.json and report.md (the table
docs/conformance.md quotes). Failures listed in known_failures.txt (a pattern and the
reason, per line) are reported as known; others as new.
"""
from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import pathlib
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_FILES = ["lax_test", "lax_numpy_test", "lax_numpy_reducers_test", "lax_numpy_indexing_test",
                 "lax_numpy_operators_test", "lax_control_flow_test", "lax_autodiff_test",
                 "random_test", "linalg_test", "nn_test",
                 "shard_map_test", "pjit_test", "pmap_test", "array_test", "memories_test", "multi_device_test",
                 "shard_alike_test", "layout_test"]
# Files of multi-device tests run with 8 modelled IPUs (JAX's tests skip
# their multi-device cases below 8 devices, or split over what they find);
# the others with the default one.
MULTI_DEVICE_FILES = {"shard_map_test", "pjit_test", "pmap_test", "array_test", "memories_test",
                      "multi_device_test", "shard_alike_test", "layout_test"}
MULTI_DEVICE_COUNT = 8
# Files run as if the IPU were a GPU (the as_gpu.py plugin): JAX runs most
# of memories_test (memory kinds, host offloading, compute_on) only when the
# device under test is a TPU or a GPU; jax-ipu implements what it checks.
AS_GPU_FILES = {"memories_test"}


def known_failures(path: pathlib.Path) -> list[tuple[str, str]]:
    """Lines of `pattern  # reason`; blank lines and lone comments skipped."""
    entries = []
    for line in path.read_text().splitlines():
        pattern, _, reason = line.partition("#")
        if pattern.strip():
            entries.append((pattern.strip(), reason.strip()))
    return entries


# A clear compile-time refusal of a type the IPU does not have is the
# specified behaviour, not a failure: such tests leave the denominator.
# bfloat16 and complex64 are emulated, so a refusal of them is a failure.
_ABSENT = r"(?:f64|float64|i64|int64|ui64|uint64|complex<f64>|complex128|\w*float8\w*|f8\w*|u?int[24]|u?i[24]|\w*float4\w*)"
ABSENT_TYPE = re.compile(rf"the IPU has no {_ABSENT} type|element type {_ABSENT} is not supported|"
                         rf"{_ABSENT} arrays cannot be placed on an IPU")


def bucket_of(message: str) -> str:
    """A failure's signature: its first meaningful line with numbers, shapes
    and quoted values blanked, so that one cause makes one bucket."""
    lines = [l.strip() for l in message.splitlines() if l.strip()]
    key = next((l for l in lines if re.search(r"Error|error|UNIMPLEMENTED|INVALID|INTERNAL|assert", l)),
               lines[0] if lines else "no message")
    key = re.sub(r"at [^:]+\.py:\d+:\d+[^)]*\)", "at <loc>", key)
    key = re.sub(r"tensor<[^>]*>", "tensor<...>", key)
    key = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", key)
    key = re.sub(r"\d+", "N", key)
    return key[:200]


# ipu first, so that it is JAX's default backend and the device the tests
# run on; cpu beside it, as JAX runs host callbacks (jax.debug.print...) on
# its CPU backend (under JAX_PLATFORMS=ipu alone they fail).
PLATFORMS = "ipu,cpu"


def check_default_backend(jax_src: pathlib.Path) -> None:
    """Exits unless `ipu` is JAX's default backend where the tests run."""
    done = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"], cwd=jax_src,
                          env=dict(os.environ, JAX_PLATFORMS=PLATFORMS), capture_output=True, text=True)
    backend = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if backend != "ipu":
        sys.exit(f"run.py: with JAX_PLATFORMS={PLATFORMS} JAX's default backend is {backend or 'unknown'!r}, "
                 f"not 'ipu' (is jax-ipu installed?): {done.stderr.strip()[-500:]}")


def run_file(jax_src: pathlib.Path, name: str, out: pathlib.Path, workers: int, timeout: int,
             extra: list[str], as_gpu: bool = False) -> pathlib.Path:
    junit = out / f"{name}.xml"
    command = [sys.executable, "-m", "pytest", str(jax_src / "tests" / f"{name}.py"), "-q",
               "-p", "no:cacheprovider", "-p", "no:benchmark", "-o", "addopts=",
               f"--junitxml={junit}", "--timeout", str(timeout), *extra]
    if workers > 1:
        command += ["-n", str(workers), "--max-worker-restart", "1000"]
    env = dict(os.environ, JAX_PLATFORMS=PLATFORMS)
    if as_gpu:
        command += ["-p", "as_gpu"]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    if name in MULTI_DEVICE_FILES:
        env.setdefault("JAX_IPU_DEVICE_COUNT", str(MULTI_DEVICE_COUNT))
    print("+", " ".join(command), flush=True)
    with open(out / f"{name}.log", "w") as log:
        subprocess.run(command, cwd=jax_src, env=env, stdout=log, stderr=subprocess.STDOUT)
    return junit


def read_junit(path: pathlib.Path):
    """(test id, outcome, message) per test case."""
    if not path.exists():
        return
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = "failed" if kind in ("failure", "error") else "skipped"
                message = (node.get("message") or "") + "\n" + (node.text or "")
                break
        yield test_id, outcome, message


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jax-src", required=True, type=pathlib.Path, help="jax checkout (with tests/)")
    parser.add_argument("--files", nargs="*", default=DEFAULT_FILES)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("conformance-report"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument("--known", type=pathlib.Path, default=HERE / "known_failures.txt")
    parser.add_argument("--as-gpu", nargs="*", default=sorted(AS_GPU_FILES),
                        help="files run as if the IPU were a GPU (JAX's device under test)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest after --")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "failures").mkdir(exist_ok=True)
    known = known_failures(args.known) if args.known.exists() else []
    check_default_backend(args.jax_src)

    rows, buckets = [], collections.defaultdict(list)
    new_failures, fixed = [], []
    for name in args.files:
        junit = run_file(args.jax_src, name, args.out, args.workers, args.timeout, args.pytest_args,
                         as_gpu=name in args.as_gpu)
        counts = collections.Counter()
        for test_id, outcome, message in read_junit(junit):
            counts[outcome] += 1
            reason = next((r for p, r in known if fnmatch.fnmatch(test_id, p)), None)
            if outcome == "failed" and ABSENT_TYPE.search(message):
                outcome = "excluded"
                counts["failed"] -= 1
                counts["excluded"] += 1
            if outcome == "failed":
                safe = re.sub(r"[^\w.-]+", "_", test_id)[:180]
                (args.out / "failures" / f"{safe}.txt").write_text(message)
                buckets[bucket_of(message)].append(test_id)
                if reason is None:
                    new_failures.append(test_id)
            elif outcome == "passed" and reason is not None:
                fixed.append(test_id)
        ran = counts["passed"] + counts["failed"]
        rows.append((f"{name} (as gpu)" if name in args.as_gpu else name, counts["passed"], counts["failed"], counts["skipped"], counts["excluded"],
                     100.0 * counts["passed"] / ran if ran else 0.0))

    passed = sum(r[1] for r in rows)
    failed = sum(r[2] for r in rows)
    lines = ["| test file | passed | failed | skipped by JAX | excluded: type absent on IPU | pass rate |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {n} | {p} | {f} | {s} | {x} | {rate:.1f}% |" for n, p, f, s, x, rate in rows]
    total = 100.0 * passed / (passed + failed) if passed + failed else 0.0
    lines.append(f"| **all** | {passed} | {failed} | {sum(r[3] for r in rows)} | {sum(r[4] for r in rows)} "
                 f"| **{total:.1f}%** |")
    lines += ["", "Denominator: passed + failed. Not counted: tests JAX itself skips on this platform "
              "or configuration, and tests of types the IPU does not have (f64, complex128, 64-, 4- and "
              "2-bit integers, fp8, fp4) that jax-ipu refuses at compile time with a clear error, as specified "
              "(bfloat16 and complex64 are emulated and counted).", "",
              "Failure buckets (largest first):", ""]
    for key, tests in sorted(buckets.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- {len(tests)} x `{key}` (e.g. {tests[0]})")
    report = "\n".join(lines)
    (args.out / "report.md").write_text(report + "\n")
    (args.out / "buckets.json").write_text(json.dumps(buckets, indent=1))
    print(report)
    print(f"\n{len(new_failures)} failures not in {args.known.name}; "
          f"{len(fixed)} known failures now pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
