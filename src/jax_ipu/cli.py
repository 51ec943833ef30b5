"""The `jax-ipu` command.

    jax-ipu report FILE|DIR [--top N]   summarise profile reports (JSON)
    jax-ipu report --html OUT FILE|DIR  write each report's page (HTML, to
                                        open in a browser) into directory OUT
    jax-ipu trace FILE [-o OUT]         a report's last run as a timeline
                                        (Chrome / Perfetto trace events)
    jax-ipu devices                     list the modelled IPUs
"""
from __future__ import annotations

import argparse
import json
import os
import sys

TRACE_SUFFIX = ".trace.json"


def _load(command: str, path: str) -> dict | None:
    """A profile report from a JSON file, or None (having said why)."""
    from jax_ipu.profile.report import FORMAT
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"jax-ipu {command}: cannot read {path}: {exc}", file=sys.stderr)
        return None
    if isinstance(report, dict) and "traceEvents" in report:
        print(f"jax-ipu {command}: {path} is a timeline (trace events): open it in https://ui.perfetto.dev "
              f"or chrome://tracing", file=sys.stderr)
        return None
    if not isinstance(report, dict) or report.get("format") != FORMAT:
        print(f"jax-ipu {command}: {path} is not a jax-ipu profile ({FORMAT})", file=sys.stderr)
        return None
    return report


def _report(args) -> int:
    from jax_ipu.profile.text import summary
    if args.html:
        try:
            from jax_ipu.profile.html import _plotly
            _plotly()
        except ImportError as exc:
            print(f"jax-ipu report: {exc}", file=sys.stderr)
            return 1
    paths = []
    for path in args.files:
        if os.path.isdir(path):
            paths += sorted(os.path.join(path, f) for f in os.listdir(path)
                            if f.endswith(".json") and not f.endswith(TRACE_SUFFIX))
        else:
            paths.append(path)
    if not paths:
        print("jax-ipu report: no profile files found", file=sys.stderr)
        return 1
    status = 0
    for i, path in enumerate(paths):
        report = _load("report", path)
        if report is None:
            status = 1
            continue
        if args.html:
            from jax_ipu.profile.html import write_html
            os.makedirs(args.html, exist_ok=True)
            name = os.path.basename(path)
            out = os.path.join(args.html, (name[:-len(".json")] if name.endswith(".json") else name) + ".html")
            try:
                print(write_html(report, out))
            except (OSError, KeyError, TypeError, ValueError) as exc:
                print(f"jax-ipu report: cannot write the page of {path} to {out}: {exc!r}", file=sys.stderr)
                status = 1
            continue
        if i:
            print()
        if len(paths) > 1:
            print(f"== {path}")
        print(summary(report, top=args.top))
    return status


def _trace(args) -> int:
    from jax_ipu.profile.trace import write_trace
    report = _load("trace", args.file)
    if report is None:
        return 1
    if not report.get("compiled", True):
        print(f"jax-ipu trace: {args.file} is the report of a program that did not compile: it has no run",
              file=sys.stderr)
        return 1
    out = args.output or (args.file[:-len(".json")] if args.file.endswith(".json") else args.file) + TRACE_SUFFIX
    write_trace(report, out)
    print(out)
    return 0


def _devices(args) -> int:
    import jax

    import jax_ipu
    for device in jax.devices("ipu"):
        print(f"{device!r}: {jax_ipu.target(device).describe()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jax-ipu", description="jax-ipu: JAX on the Graphcore IPU Model")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="summarise profile reports (JSON files or directories)")
    report.add_argument("files", nargs="+", metavar="FILE")
    report.add_argument("--top", type=int, default=10, help="steps and compute sets to list (default 10)")
    report.add_argument("--html", metavar="OUT", help="write each report's page (one self-contained HTML file "
                        "per program, named after its JSON file) into directory OUT instead of the summary")
    report.set_defaults(run=_report)
    trace = commands.add_parser("trace", help="write a report's last run as Chrome / Perfetto trace events")
    trace.add_argument("file", metavar="FILE")
    trace.add_argument("-o", "--output", help="where to write it (default: FILE with .trace.json)")
    trace.set_defaults(run=_trace)
    devices = commands.add_parser("devices", help="list the modelled IPUs")
    devices.set_defaults(run=_devices)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
