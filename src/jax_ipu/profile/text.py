"""A readable summary of a profile report (what `jax-ipu report` prints)."""
from __future__ import annotations


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _seconds(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-2 else f"{s * 1e3:.2f} ms"


def _busiest_tiles(mem: dict, top: int) -> list[str]:
    per_tile = mem["per_tile"]
    peak = per_tile["peak"]
    tiles = sorted(range(len(peak)), key=lambda t: -peak[t])[:top]
    lines = [f"  busiest tiles: {'tile':>6} {'peak':>10} {'always-live':>12} {'not-always-live':>16}"]
    for t in tiles:
        over = peak[t] - mem["bytes_per_tile"]
        lines.append(f"  {'':15}{t:>6} {_bytes(peak[t]):>10} {_bytes(per_tile['always_live'][t]):>12} "
                     f"{_bytes(per_tile['not_always_live_peak'][t]):>16}"
                     + (f"  {_bytes(over)} over" if over > 0 else ""))
    return lines


def _static(report: dict) -> list[str]:
    static = report.get("static_estimate")
    if not static:
        return []
    lines = [f"  compile-time estimate: {static['cycles']:,} cycles"
             + (" (loops of unknown trip count: no iteration)" if static["unknown_trip_loops"] else "")]
    for loop in static["unknown_trip_loops"]:
        entered = loop["entered"]
        lines.append(f"    + {loop['cycles_per_iteration']:,} cycles per iteration of {loop['name']} "
                     f"(trip count unknown at compile time"
                     + ("" if entered == 1 else f"; entered {entered} times" if entered else
                        "; inside another such loop") + ")")
    return lines


def summary(report: dict, top: int = 10) -> str:
    target, mem, host = report["target"], report["memory"], report["host_transfers"]
    cycles, seconds = report["cycles"], report["estimated_seconds"]
    per_tile = mem["per_tile"]
    tiles_used = sum(1 for p in per_tile["peak"] if p)
    compiled = report.get("compiled", True)
    where = f"on IPU {report['device']}" if compiled else "did not compile"
    lines = [f"Program {report['program']} {where}: {target['description']}"]
    if not compiled:
        lines += ["", f"  {report['error']}"]
    lines += [
        "",
        "Memory",
        f"  {'fits' if mem['fits'] else 'DOES NOT FIT'}: peak {_bytes(mem['max_bytes'])} on tile {mem['max_tile']} "
        f"of {_bytes(mem['bytes_per_tile'])} per tile"
        + ("" if mem["fits"] else f" ({mem['tiles_over_limit']} tiles over the limit)"),
        f"  total {_bytes(mem['total_bytes'])} on {tiles_used} tiles: always-live {_bytes(mem['always_live_bytes'])} "
        f"(arguments {_bytes(sum(per_tile['arguments']))}, constants {_bytes(sum(per_tile['constants']))}, "
        f"code and vertex state {_bytes(sum(per_tile['code']))}), "
        f"not-always-live peak {_bytes(mem['not_always_live_peak_bytes'])}",
    ]
    if mem["largest_tensors_on_max_tile"]:
        lines.append(f"  largest tensors on tile {mem['max_tile']}:")
        for t in mem["largest_tensors_on_max_tile"]:
            lines.append(f"    {_bytes(t['bytes_on_tile']):>10}  {t['name']} {t['dtype']}{t['shape']}"
                         + ("  (always-live)" if t["always_live"] else ""))
    lines += _busiest_tiles(mem, min(top, 5))
    if not compiled:
        return "\n".join(lines + ["", "Execution", *_static(report)])
    steps = report["steps"]
    executes = [s for s in steps if s["kind"] == "Execute"]
    copies = [s for s in steps if s["kind"] == "Copy"]
    lines += [
        "",
        "Execution (last run)",
        f"  {len(executes)} compute sets and {len(copies)} copies executed"
        + (f" (+{report['steps_not_listed']} steps not listed)" if report.get("steps_not_listed") else ""),
        f"  {cycles['device']:,} cycles = {_seconds(seconds['device'])} at {target['clock_hz'] / 1e9:.3g} GHz; "
        f"{_bytes(report['exchange_bytes'])} exchanged between tiles",
        f"  host transfers: {_bytes(host['bytes'])} ({len(host['host_to_device'])} in, "
        f"{len(host['device_to_host'])} out) = {_seconds(host['seconds'])} "
        f"at {target['host_link_bytes_per_second'] / 1e9:.3g} GB/s",
        f"  estimated IPU time: {_seconds(seconds['total'])}",
        *_static(report),
    ]
    between = report.get("between_processes")
    if between and between["exchanges"]:
        lines.append(f"  between processes: {between['exchanges']} exchange(s), {_bytes(between['bytes_sent'])} sent, "
                     f"{_bytes(between['bytes_received'])} received in {_seconds(between['seconds'])} "
                     "(the transport's wall time, not IPU time)")
    if report.get("trace_file"):
        lines.append(f"  timeline: {report['trace_file']} (open it in https://ui.perfetto.dev or chrome://tracing)")
    runs = report.get("runs")
    if runs:
        lines.append(f"  runs: {runs['count']}, {runs['total_cycles']:,} cycles in all "
                     f"(min {runs['min_cycles']:,}, max {runs['max_cycles']:,}), "
                     f"estimated {_seconds(runs['total_estimated_seconds'])} in all")
    total = max(cycles["device"], 1)
    busiest = sorted(steps, key=lambda s: -s["cycles"])[:top]
    if busiest:
        lines += ["", f"Busiest steps (of {len(steps)})",
                  f"  {'cycles':>12} {'share':>6} {'exchange':>10}  step"]
        for s in busiest:
            lines.append(f"  {s['cycles']:>12,} {100 * s['cycles'] / total:5.1f}% {_bytes(s['exchange_bytes']):>10}  "
                         f"{s['kind']} {s['name']}")
    emulated = report.get("emulated")
    if emulated:
        total = sum(e["cycles"] for e in emulated)
        lines += ["", f"Emulated types (the IPU has no bfloat16 or complex arithmetic): {total:,} cycles of the "
                      "compile-time estimate", f"  {'ops':>6} {'cycles':>12}  emulated"]
        for e in emulated[:top]:
            lines.append(f"  {e['count']:>6} {e['cycles']:>12,}  {e['op']}")
    sets = report["compute_sets"]
    if sets:
        lines += ["", f"Compute sets ({len(sets)})", f"  {'vertices':>8} {'tiles':>6} {'cycles':>12}  name"]
        for cs in sorted(sets, key=lambda c: -c["cycles"])[:top]:
            lines.append(f"  {cs['vertices']:>8} {cs['tiles']:>6} {cs['cycles']:>12,}  {cs['name']}")
    return "\n".join(lines)
