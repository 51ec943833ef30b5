"""The `jax-ipu` command.

    jax-ipu report FILE|DIR [--top N]   summarise profile reports (JSON)
    jax-ipu devices                     list the modelled IPUs
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _report(args) -> int:
    from jax_ipu.profile.report import FORMAT
    from jax_ipu.profile.text import summary
    paths = []
    for path in args.files:
        if os.path.isdir(path):
            paths += sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".json"))
        else:
            paths.append(path)
    if not paths:
        print("jax-ipu report: no profile files found", file=sys.stderr)
        return 1
    status = 0
    for i, path in enumerate(paths):
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"jax-ipu report: cannot read {path}: {exc}", file=sys.stderr)
            status = 1
            continue
        if not isinstance(report, dict) or report.get("format") != FORMAT:
            print(f"jax-ipu report: {path} is not a jax-ipu profile ({FORMAT})", file=sys.stderr)
            status = 1
            continue
        if i:
            print()
        if len(paths) > 1:
            print(f"== {path}")
        print(summary(report, top=args.top))
    return status


def _devices(args) -> int:
    import jax
    import jax_ipu
    for device in jax.devices("ipu"):
        print(f"{device}: {jax_ipu.target(device).describe()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jax-ipu", description="jax-ipu: JAX on the Graphcore IPU Model")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="summarise profile reports (JSON files or directories)")
    report.add_argument("files", nargs="+", metavar="FILE")
    report.add_argument("--top", type=int, default=10, help="steps and compute sets to list (default 10)")
    report.set_defaults(run=_report)
    devices = commands.add_parser("devices", help="list the modelled IPUs")
    devices.set_defaults(run=_devices)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
