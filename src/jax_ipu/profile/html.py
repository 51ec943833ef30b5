"""A profile report as one self-contained HTML page (what PopVision's Graph
Analyser shows, for the IPU Model's reports):

- memory per tile: a heat map over all tiles (hover: the tile's bytes by
  category and its largest tensor) and the same as bars by category;
- liveness: not-always-live bytes at each top-level program step on all
  tiles and on the busiest one, the peak marked, the tensors live there;
- for a program that does not fit: the tiles over the limit and the
  largest tensors on them;
- the last run: the BSP view (compute, exchange and sync cycles of every
  executed step) and the busiest compute sets;
- the program tree with each node's estimated cycles and, for compute sets
  and copies, what the last run spent in them.

The charts are plotly's (pip install 'jax-ipu[report]'); plotly.js is
inlined once, so the page opens offline. `jax-ipu report --html DIR` and
`jax_ipu.profile.write_html` write it."""
from __future__ import annotations

import collections
import html
import json
import math
import re

from jax_ipu.profile.text import _bytes, _seconds

COLUMNS = 64           # tiles per row of the heat map (1,472 = 23 rows of 64)
TOP_STEPS = 20        # busiest compute sets listed
TOP_COPIES = 10       # and copies
LIVE_SHOWN = 12       # tensors live at the peak shown unfolded
LABEL = 72            # characters of a chart's step labels
HOVER_NAME = 84       # characters of a tensor's name in the heat map's hover label
TREE_OPEN_DEPTH = 1    # program tree levels shown unfolded

PHASE_COLOURS = {"compute": "#4c78a8", "exchange": "#f58518", "sync": "#9d9d9d", "other": "#b279a2"}
CATEGORY_COLOURS = {"arguments": "#4c78a8", "constants": "#72b7b2", "code": "#b279a2",
                    "not_always_live_peak": "#f58518"}
CATEGORY_NAMES = {"arguments": "arguments", "constants": "constants", "code": "code and vertex state",
                  "not_always_live_peak": "not-always-live peak"}
# A tile's fill as a share of its memory: blues while there is room,
# orange to red near the limit.
HEAT = [[0.0, "#f4f6fa"], [0.002, "#deebf7"], [0.1, "#9ecae1"], [0.25, "#4292c6"], [0.5, "#08519c"],
        [0.75, "#fd8d3c"], [0.9, "#e6550d"], [1.0, "#a50026"]]
MISSING = ("the report page draws its charts with plotly: install it with "
           "pip install 'jax-ipu[report]' (or pip install plotly)")


def _plotly():
    try:
        import plotly.graph_objects as go
        import plotly.io as pio
        from plotly.offline import get_plotlyjs
        from plotly.subplots import make_subplots
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    return go, pio, get_plotlyjs, make_subplots


def _e(text) -> str:
    return html.escape(str(text), quote=True)


_PATH = re.compile(r"@[^\s@()]*/([^/\s:()]+:\d+)(?::\d+)?")


def short(name: str) -> str:
    """A tensor's or step's name with its source file's directories left
    out (convolution@/home/me/model.py:31:27 -> convolution@model.py:31)."""
    return _PATH.sub(r"@\1", name)


_NAMED = re.compile(r"^(?P<head>[^@]*)@(?P<where>\S+)\s+\((?P<stack>\S+)(?: in [^)]*)?\)(?P<rest>.*)$")


def brief(name: str, depth: int = 3, where: bool = False) -> str:
    """A chart label: the step's kind and the last parts of JAX's name stack
    (fused multiply@m.py:3 (jit(f)/transpose(jvp(Net))/Dense_0/mul in f)
    -> fused multiply Dense_0/mul (backward)); the name itself if it has
    none."""
    m = _NAMED.match(name)
    if not m:
        return short(name)
    parts = [p for p in m["stack"].split("/") if not p.startswith(("jit(", "pjit("))]
    backward = any(p.startswith("transpose(") for p in parts)
    parts = [p for p in parts if not p.startswith(("transpose(", "jvp("))]
    head = m["head"].strip() + (f"@{short('@' + m['where'])[1:]}" if where else "")
    return " ".join(x for x in (head, "/".join(parts[-depth:]), "(backward)" if backward else "") if x)


def _code(name: str) -> str:
    """A name, shortened, with the full one on hover."""
    return f"<code title='{_e(name)}'>{_e(short(name))}</code>"


def _unit(largest: float) -> tuple[float, str]:
    for divisor, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if largest >= 4 * divisor:
            return divisor, name
    return 1, "B"


def _layout(**kw) -> dict:
    base = dict(template="plotly_white", margin=dict(l=60, r=20, t=30, b=45),
                font=dict(family="-apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif", size=12),
                hoverlabel=dict(font=dict(family="ui-monospace, 'SFMono-Regular', Menlo, Consolas, monospace",
                                          size=12), align="left"),
                legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0))
    base.update(kw)
    return base


# -- figures ------------------------------------------------------------------

def tile_grid(num_tiles: int) -> tuple[int, int]:
    """(columns, rows) of the heat map: tile t at row t // columns."""
    columns = max(1, min(COLUMNS, num_tiles))
    return columns, max(1, math.ceil(num_tiles / columns))


def _tile_map(go, report: dict):
    mem = report["memory"]
    per_tile, limit = mem["per_tile"], mem["bytes_per_tile"]
    peak = per_tile["peak"]
    n = len(peak)
    columns, rows = tile_grid(n)
    names = mem.get("largest_tensor_names", [])
    largest, largest_bytes = per_tile.get("largest_tensor"), per_tile.get("largest_tensor_bytes")
    z = [[None] * columns for _ in range(rows)]
    text = [[""] * columns for _ in range(rows)]
    for t in range(n):
        r, c = divmod(t, columns)
        z[r][c] = peak[t] / 1024
        lines = [f"<b>tile {t}</b>: {_bytes(peak[t])} of {_bytes(limit)} ({100 * peak[t] / limit:.1f}%)"]
        if peak[t] > limit:
            lines.append(f"<b>over the limit by {_bytes(peak[t] - limit)}</b>")
        lines += [f"arguments            {_bytes(per_tile['arguments'][t]):>10}",
                  f"constants            {_bytes(per_tile['constants'][t]):>10}",
                  f"code, vertex state   {_bytes(per_tile['code'][t]):>10}",
                  f"not-always-live peak {_bytes(per_tile['not_always_live_peak'][t]):>10}"]
        if largest is not None and largest[t] >= 0:
            name = brief(names[largest[t]], where=True)
            name = name if len(name) <= HOVER_NAME else name[:HOVER_NAME - 3] + "..."
            lines += [f"largest tensor       {_bytes(largest_bytes[t]):>10}", f"  {_e(name)}"]
        text[r][c] = "<br>".join(lines)
    traces = [go.Heatmap(z=z, text=text, hovertemplate="%{text}<extra></extra>", zmin=0, zmax=limit / 1024,
                         colorscale=HEAT, xgap=1, ygap=1, name="tiles",
                         colorbar=dict(title=dict(text="KiB at peak", side="right"), thickness=14))]
    over = [t for t in range(n) if peak[t] > limit]
    if over:
        traces.append(go.Scatter(x=[t % columns for t in over], y=[t // columns for t in over], mode="markers",
                                 marker=dict(symbol="x-thin", size=7, line=dict(width=2, color="#000")),
                                 name="over the limit", hoverinfo="skip"))
    fig = go.Figure(traces)
    # Colours from 0 to a tile's memory, or to the busiest tile (small programs).
    busiest = max(max(peak, default=0), 1) / 1024
    fig.update_layout(updatemenus=[dict(
        type="buttons", direction="right", x=0.0, xanchor="left", y=1.02, yanchor="bottom", showactive=True,
        pad=dict(r=0, t=0, b=0), font=dict(size=11), buttons=[
            dict(label="scale: tile memory", method="restyle", args=[{"zmax": [limit / 1024]}, [0]]),
            dict(label="scale: busiest tile", method="restyle", args=[{"zmax": [busiest]}, [0]])])])
    step = max(1, rows // 12)
    fig.update_layout(**_layout(height=max(190, 17 * rows + 100), showlegend=bool(over),
                                margin=dict(l=60, r=20, t=40, b=40)))
    fig.update_xaxes(title_text=f"tile mod {columns}", showgrid=False, zeroline=False, constrain="domain",
                     range=[-0.5, columns - 0.5], **({"dtick": 1} if columns <= 16 else {}))
    fig.update_yaxes(title_text="tiles from", autorange="reversed", showgrid=False,
                     zeroline=False, tickvals=list(range(0, rows, step)),
                     ticktext=[str(r * columns) for r in range(0, rows, step)])
    return fig


def _memory_bars(go, report: dict):
    mem = report["memory"]
    per_tile = mem["per_tile"]
    n = len(per_tile["peak"])
    divisor, unit = _unit(max(max(per_tile["peak"], default=0), mem["bytes_per_tile"]))
    tiles = list(range(n))
    fig = go.Figure([go.Bar(x=tiles, y=[b / divisor for b in per_tile[key]], name=CATEGORY_NAMES[key],
                            marker=dict(color=colour, line=dict(width=0)),
                            hovertemplate=f"%{{y:.1f}} {unit}<extra>{CATEGORY_NAMES[key]}</extra>")
                     for key, colour in CATEGORY_COLOURS.items()])
    fig.add_hline(y=mem["bytes_per_tile"] / divisor, line=dict(color="#a50026", dash="dash", width=1),
                  annotation_text=f"{_bytes(mem['bytes_per_tile'])} per tile", annotation_position="top left")
    fig.update_layout(**_layout(height=300, barmode="stack", bargap=0, hovermode="x unified"))
    fig.update_xaxes(title_text="tile")
    fig.update_yaxes(title_text=unit)
    return fig


def _liveness(go, make_subplots, report: dict):
    mem = report["memory"]
    live = mem.get("liveness")
    if not live or not live["not_always_live"]:
        return None
    steps = live["steps"]
    total, exchange, tile = live["not_always_live"], live["exchange_buffers"], live["on_max_tile"]
    names = [f"step {i}: {s['kind']} {_e(short(s['name']))}" for i, s in enumerate(steps)]
    x = list(range(len(total)))
    divisor, unit = _unit(max(total))
    max_tile = mem["max_tile"]
    always = mem["per_tile"]["always_live"][max_tile]
    limit = mem["bytes_per_tile"]
    tile_divisor, tile_unit = _unit(max(limit, always + max(tile)))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, row_heights=[0.6, 0.4],
                        subplot_titles=("not-always-live memory, all tiles",
                                        f"tile {max_tile} (the busiest): always-live + not-always-live"))
    fig.add_trace(go.Scatter(x=x, y=[(a - b) / divisor for a, b in zip(total, exchange, strict=True)], name="tensors",
                             stackgroup="all", line=dict(width=0.5, color="#4c78a8"), customdata=names,
                             hovertemplate=f"%{{customdata}}<br>tensors %{{y:.2f}} {unit}<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=[b / divisor for b in exchange], name="exchange buffers", stackgroup="all",
                             line=dict(width=0.5, color="#f58518"),
                             hovertemplate=f"exchange buffers %{{y:.2f}} {unit}<extra></extra>"), 1, 1)
    at = live["peak_step"]
    fig.add_trace(go.Scatter(x=[at], y=[total[at] / divisor], mode="markers+text", name="peak",
                             marker=dict(color="#a50026", size=10, symbol="diamond"),
                             text=[f"peak {_bytes(total[at])}"], textposition="top center",
                             hovertemplate=f"peak at {names[at]}<br>%{{y:.2f}} {unit}<extra></extra>"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=[(always + b) / tile_divisor for b in tile], name=f"tile {max_tile}",
                             line=dict(color="#54a24b", width=1.5), customdata=names,
                             hovertemplate=f"%{{customdata}}<br>tile {max_tile}: %{{y:.1f}} {tile_unit}"
                                           f"<extra></extra>"), 2, 1)
    fig.add_trace(go.Scatter(x=[-0.5, len(x) - 0.5], y=[limit / tile_divisor] * 2, mode="lines",
                             name="tile memory", line=dict(color="#a50026", dash="dash", width=1),
                             hoverinfo="skip"), 2, 1)
    fig.update_layout(**_layout(height=540, hovermode="closest", margin=dict(l=60, r=20, t=70, b=45),
                                legend=dict(orientation="h", yanchor="bottom", y=1.07, xanchor="left", x=0)))
    fig.update_annotations(font_size=13, x=0, xanchor="left")
    fig.update_yaxes(title_text=unit, row=1, col=1, range=[0, 1.18 * max(total) / divisor])
    fig.update_yaxes(title_text=tile_unit, row=2, col=1, rangemode="tozero")
    few = len(x) <= 30           # a few steps: points, on whole steps
    if few:
        fig.update_traces(selector=dict(name="tensors"), mode="lines+markers")
        fig.update_traces(selector=dict(name=f"tile {max_tile}"), mode="lines+markers")
        fig.update_xaxes(dtick=1 if len(x) <= 15 else 2, range=[-0.5, len(x) - 0.5])
    fig.update_xaxes(title_text="program step (a loop is one step)", row=2, col=1)
    return fig


def _phases(step: dict) -> dict:
    if "exchange_cycles" in step:
        exchange, sync = step["exchange_cycles"], step["sync_cycles"]
        return {"compute": step["cycles"] - exchange - sync, "exchange": exchange, "sync": sync, "other": 0}
    return {"compute": 0, "exchange": 0, "sync": 0, "other": step["cycles"]}


def _bsp(go, report: dict):
    steps = report["steps"]
    if not steps:
        return None
    phases = [_phases(s) for s in steps]
    names = [f"step {i}: {s['kind']} {_e(short(s['name']))}" for i, s in enumerate(steps)]
    x = list(range(len(steps)))
    traces = []
    for phase, colour in PHASE_COLOURS.items():
        y = [p[phase] for p in phases]
        if not any(y):
            continue
        label = "host callback, stream" if phase == "other" else phase
        traces.append(go.Bar(x=x, y=y, name=label, marker=dict(color=colour, line=dict(width=0)), customdata=names,
                             hovertemplate=f"%{{customdata}}<br>{label}: %{{y:,}} cycles<extra></extra>"))
    fig = go.Figure(traces)
    fig.update_layout(**_layout(height=340, barmode="stack", bargap=0.1 if len(steps) < 200 else 0,
                                hovermode="closest"))
    # A log axis shows the many short steps beside a few long ones.
    fig.update_layout(updatemenus=[dict(
        type="buttons", direction="right", x=1.0, xanchor="right", y=1.02, yanchor="bottom", showactive=True,
        pad=dict(r=0, t=0, b=0), font=dict(size=11), buttons=[
            dict(label="linear", method="relayout", args=[{"yaxis.type": "linear"}]),
            dict(label="log", method="relayout", args=[{"yaxis.type": "log"}])])])
    fig.update_xaxes(title_text="executed step (last run, in order)")
    fig.update_yaxes(title_text="cycles")
    return fig


def _busiest_rows(report: dict) -> list[dict]:
    """The last run's compute sets and copies by their total cycles (a
    compute set or copy run in a loop counted over its iterations)."""
    static = {c["name"]: c for c in report["compute_sets"]}
    rows: dict = {}
    for s in report["steps"]:
        if s["kind"] not in ("Execute", "Copy"):
            continue
        row = rows.setdefault((s["kind"], s["name"]), {
            "kind": s["kind"], "name": s["name"], "runs": 0, "cycles": 0, "exchange_bytes": 0,
            "compute": 0, "exchange": 0, "sync": 0, "other": 0})
        row["runs"] += 1
        row["cycles"] += s["cycles"]
        row["exchange_bytes"] += s["exchange_bytes"]
        for phase, n in _phases(s).items():
            row[phase] += n
    out = sorted(rows.values(), key=lambda r: -r["cycles"])
    for row in out:
        info = static.get(row["name"], {}) if row["kind"] == "Execute" else {}
        row.update(vertices=info.get("vertices"), tiles=info.get("tiles"), codelets=info.get("codelets", {}))
    return out


def _label(row: dict) -> str:
    name = brief(row["name"])
    if len(name) > LABEL:
        name = brief(row["name"], depth=2)
    name = name if len(name) <= LABEL else name[:LABEL - 3] + "..."
    return name if row["kind"] == "Execute" else f"copy to {name}"


def _busiest(go, rows: list[dict]):
    top = rows[:TOP_STEPS][::-1]
    if not top:
        return None
    # y labels kept distinct (zero-width spaces) where two are equal:
    # plotly merges equal categories.
    seen: collections.Counter = collections.Counter()
    labels = []
    for r in top:
        label = _label(r)
        labels.append(label + "\u200b" * seen[label])
        seen[label] += 1
    full = [f"{r['kind']} {_e(short(r['name']))}<br>ran {r['runs']:,}x" for r in top]
    traces = [go.Bar(y=labels, x=[r[phase] for r in top], orientation="h", name=phase, customdata=full,
                     marker=dict(color=colour, line=dict(width=0)),
                     hovertemplate=f"%{{customdata}}<br>{phase}: %{{x:,}} cycles<extra></extra>")
              for phase, colour in PHASE_COLOURS.items() if any(r[phase] for r in top)]
    fig = go.Figure(traces)
    fig.update_layout(**_layout(height=max(220, 22 * len(top) + 90), barmode="stack", hovermode="closest",
                                margin=dict(l=20, r=20, t=30, b=45)))
    fig.update_yaxes(automargin=True, tickfont=dict(family="ui-monospace, Menlo, Consolas, monospace", size=11))
    fig.update_xaxes(title_text="cycles in the last run")
    return fig


# -- tables and the tree --------------------------------------------------------

def _table(header: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th class='{'num' if i in numeric else ''}'>{_e(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td class='{'num' if i in numeric else ''}'>{cell}</td>"
                                     for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _shape(t: dict) -> str:
    return f"{t['dtype']}[{','.join(map(str, t['shape']))}]"


STREAMS = ("HostToDevice", "DeviceToHost")


def _tree_row(node: dict, total: int, executed: dict) -> str:
    kind, name = node["kind"], node["name"]
    cycles = node.get("cycles", 0)
    share = 100 * cycles / total if total else 0.0
    extra = ""
    if kind == "Repeat":
        extra = f"<span class='dim'>x{node['count']:,}</span>"
    if "cycles_per_iteration" in node:
        extra = f"<span class='dim'>{node['cycles_per_iteration']:,} cycles per iteration</span>"
    if "host_cycles" in node:
        extra = f"<span class='dim'>{node['host_cycles']:,} cycles on the host link</span>"
    ran = executed.get((kind, name, cycles))
    if ran:      # the run's executions of steps like this one, shared out among them
        extra += f"<span class='dim'>ran {ran[0] // ran[2]:,}x: {ran[1] // ran[2]:,} cycles</span>"
    label = _code(name) if kind not in ("Sequence", "More") else f"<span class='name'>{_e(name)}</span>"
    return (f"<span class='kind k-{_e(kind)}'>{_e(kind)}</span>{label}{extra}"
            f"<span class='cyc'><span class='bar'><span style='width:{min(share, 100):.1f}%'></span></span>"
            f"<span class='n'>{cycles:,}</span><span class='share'>{share:.1f}%</span></span>")


def _tree_html(node: dict, total: int, executed: dict, depth: int = 0) -> str:
    children = node.get("children")
    row = _tree_row(node, total, executed)
    if not children:
        return f"<li class='leaf'><div class='row'>{row}</div></li>"
    inner, run = [], []

    def flush():
        # A run of host streams folds into one node.
        if len(run) > 2:
            items = "".join(f"<li class='leaf'><div class='row'>{_tree_row(c, total, executed)}</div></li>"
                            for c in run)
            inner.append(f"<li><details><summary class='row'><span class='kind'>{run[0]['kind']}</span>"
                         f"<span class='name'>{len(run)} streams: {_e(run[0]['name'])} to "
                         f"{_e(run[-1]['name'])}</span><span class='dim'>"
                         f"{sum(c.get('host_cycles', 0) for c in run):,} cycles on the host link</span>"
                         f"</summary><ul>{items}</ul></details></li>")
        else:
            inner.extend(_tree_html(c, total, executed, depth + 1) for c in run)
        run.clear()

    for c in children:
        if c["kind"] in STREAMS and (not run or run[0]["kind"] == c["kind"]):
            run.append(c)
            continue
        flush()
        if c["kind"] in STREAMS:
            run.append(c)
        else:
            inner.append(_tree_html(c, total, executed, depth + 1))
    flush()
    opened = " open" if depth < TREE_OPEN_DEPTH else ""
    return f"<li><details{opened}><summary class='row'>{row}</summary><ul>{''.join(inner)}</ul></details></li>"


# -- the page ---------------------------------------------------------------------

CSS = """
:root { --fg: #1f2430; --dim: #6b7385; --line: #e3e6ee; --bg: #f6f7fb; --card: #fff; --bad: #a50026; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
       font: 14px/1.45 -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif; }
header { background: #1d2536; color: #fff; padding: 18px 28px 14px; }
header h1 { margin: 0; font-size: 20px; font-weight: 600; }
header .sub { color: #b8c0d4; margin-top: 2px; }
nav { margin-top: 10px; }
nav a { color: #cfd8ee; text-decoration: none; margin-right: 16px; font-size: 13px; }
nav a:hover { color: #fff; }
main { max-width: 1280px; margin: 0 auto; padding: 18px 24px 40px; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px;
          margin-bottom: 18px; }
section h2 { font-size: 16px; margin: 0 0 4px; }
section h3 { font-size: 14px; font-weight: 600; margin: 14px 0 2px; }
section p.note { color: var(--dim); margin: 0 0 8px; font-size: 13px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px;
         margin-bottom: 18px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; }
.card .v { font-size: 19px; font-weight: 600; }
.card .l { color: var(--dim); font-size: 12px; }
.card.bad { border-color: var(--bad); } .card.bad .v { color: var(--bad); }
.banner { background: #fff0f0; border: 1px solid var(--bad); color: #5c0015; border-radius: 8px;
          padding: 10px 14px; margin-bottom: 18px; white-space: pre-wrap; font-size: 13px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; margin-top: 6px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--dim); font-weight: 600; background: #fafbfd; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code, .mono { font-family: ui-monospace, 'SFMono-Regular', Menlo, Consolas, monospace; font-size: 12px; }
.tree ul { list-style: none; margin: 0; padding-left: 18px; border-left: 1px dotted var(--line); }
.tree > ul { padding-left: 0; border: 0; }
.tree { max-height: 760px; overflow: auto; border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; }
.tree .row { display: flex; gap: 8px; align-items: baseline; padding: 1px 0; cursor: default; }
.tree .row:hover { background: #f3f6fc; }
.tree .bar { display: inline-block; width: 80px; height: 8px; background: #eef1f7; border-radius: 2px;
             margin-right: 10px; vertical-align: middle; }
.tree .bar span { display: block; height: 100%; background: #4c78a8; border-radius: 2px; }
.tree summary.row { cursor: pointer; }
.tree code, .tree .name { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; overflow: hidden;
              text-overflow: ellipsis; white-space: nowrap; max-width: 640px; }
.tree .cyc { margin-left: auto; font-variant-numeric: tabular-nums; white-space: nowrap; }
.tree .n { display: inline-block; min-width: 92px; text-align: right; }
.tree .share { display: inline-block; width: 56px; text-align: right; color: var(--dim); }
.tree li.leaf { padding-left: 14px; }
.kind { font-size: 11px; padding: 0 5px; border-radius: 3px; background: #eef1f7; color: #3b4560; }
.k-Execute { background: #e3ecf7; } .k-Copy { background: #fdebd9; } .k-Repeat, .k-RepeatWhileTrue { background: #e5f3e3; }
.dim { color: var(--dim); font-size: 12px; }
.two { display: grid; grid-template-columns: 1fr; gap: 12px; }
"""


def _cards(report: dict) -> str:
    mem, cycles, seconds = report["memory"], report["cycles"], report["estimated_seconds"]
    compiled = report.get("compiled", True)
    cards = []
    if compiled:
        cards.append(("estimated IPU time", _seconds(seconds["total"]), False))
        cards.append(("device cycles, last run", f"{cycles['device']:,}", False))
    else:
        cards.append(("compile-time estimate", f"{report['static_estimate']['cycles']:,} cycles", False))
    cards += [
        (f"peak, on tile {mem['max_tile']} (of {_bytes(mem['bytes_per_tile'])})", _bytes(mem["max_bytes"]),
         not mem["fits"]),
        ("memory on all tiles", _bytes(mem["total_bytes"]), False),
        ("not-always-live: tiles' peaks summed", _bytes(mem["not_always_live_peak_bytes"]), False),
    ]
    if not mem["fits"]:
        cards.append(("tiles over the limit", f"{mem['tiles_over_limit']:,}", True))
    if compiled:
        host = report["host_transfers"]
        cards += [("exchanged between tiles", _bytes(report["exchange_bytes"]), False),
                  ("host transfers", f"{_bytes(host['bytes'])} = {_seconds(host['seconds'])}", False)]
        runs = report.get("runs")
        if runs:
            cards.append(("runs profiled", f"{runs['count']:,}", False))
    return "<div class='cards'>" + "".join(
        f"<div class='card{' bad' if bad else ''}'><div class='v'>{_e(v)}</div><div class='l'>{_e(label)}</div></div>"
        for label, v, bad in cards) + "</div>"


def _over_limit(report: dict) -> str:
    mem = report["memory"]
    tiles = mem.get("over_limit", [])
    rows = []
    for t in tiles:
        on = "<br>".join(f"{_bytes(x['bytes_on_tile'])} <code>{_e(x['name'])}</code> {_e(_shape(x))}"
                         + (" <span class='dim'>always-live</span>" if x.get("always_live") else "")
                         for x in t["tensors"])
        rows.append([str(t["tile"]), _bytes(t["peak"]), _bytes(t["over"]), _bytes(t["always_live"]),
                     _bytes(t["not_always_live_peak"]), on])
    more = mem["tiles_over_limit"] - len(tiles)
    note = f"<p class='note'>{more:,} more tiles over the limit are not listed.</p>" if more > 0 else ""
    return (_table(["tile", "peak", "over by", "always-live", "not-always-live peak", "largest tensors there"],
                   rows, numeric={0, 1, 2, 3, 4}) + note)


def render(report: dict) -> str:
    """The page of one report (a dict as profile.report builds it)."""
    go, pio, get_plotlyjs, make_subplots = _plotly()
    config = {"displaylogo": False, "responsive": True,
              "toImageButtonOptions": {"filename": report["program"]}}
    figures = {}

    def figure(key: str, fig) -> str:
        if fig is None:
            return "<p class='note'>Nothing to show.</p>"
        figures[f"fig-{key}"] = fig
        return pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"fig-{key}", config=config)

    target, mem = report["target"], report["memory"]
    compiled = report.get("compiled", True)
    title = f"{report['program']}"
    where = f"IPU {report['device']}" if compiled else "did not compile"
    sections = []
    nav = []

    def section(anchor: str, heading: str, note: str, body: str) -> None:
        nav.append(f"<a href='#{anchor}'>{_e(heading)}</a>")
        sections.append(f"<section id='{anchor}'><h2>{_e(heading)}</h2>"
                        + (f"<p class='note'>{note}</p>" if note else "") + body + "</section>")

    if not mem["fits"]:
        section("over", "Tiles over the limit",
                f"{mem['tiles_over_limit']:,} of {target['num_tiles']:,} tiles need more than their "
                f"{_bytes(mem['bytes_per_tile'])}; the worst first, with the largest tensors mapped there.",
                _over_limit(report))
    section("tiles", "Memory per tile",
            f"Peak bytes of each of the {target['num_tiles']:,} tiles (always-live plus the peak of "
            f"not-always-live), tile t at row t // {tile_grid(target['num_tiles'])[0]}; hover over a tile for "
            "its bytes by category and its largest tensor.",
            figure("tiles", _tile_map(go, report)) + figure("categories", _memory_bars(go, report)))
    live = mem.get("liveness")
    if live and live["not_always_live"]:
        at = live["peak_step"]
        step = live["steps"][at]
        rows = [[_code(t["name"]), _e(_shape(t)), _bytes(t["bytes"])] for t in live["tensors_at_peak"]]
        more = live.get("tensors_at_peak_not_listed", 0)
        shown, folded = rows[:LIVE_SHOWN], rows[LIVE_SHOWN:]
        body = (figure("liveness", _liveness(go, make_subplots, report))
                + f"<h3>Live at the peak: step {at}, {_e(step['kind'])} {_code(step['name'])}</h3>"
                  f"<p class='note'>{_bytes(live['peak_bytes'])} on all tiles, "
                  f"{_bytes(live['exchange_buffers'][at])} of it exchange buffers; the largest tensors live "
                  f"there:</p>"
                + _table(["tensor", "type", "bytes"], shown, numeric={2})
                + (f"<details><summary class='dim'>{len(folded):,} more</summary>"
                   + _table(["tensor", "type", "bytes"], folded, numeric={2}) + "</details>" if folded else "")
                + (f"<p class='note'>{more:,} smaller tensors not listed.</p>" if more else ""))
        section("liveness", "Liveness",
                "Memory that is not always live (intermediate tensors and the exchange buffers a step "
                "receives into) at each top-level program step; a loop is one step.", body)
    if compiled and report["steps"]:
        steps = report["steps"]
        totals = {p: sum(_phases(s)[p] for s in steps) for p in PHASE_COLOURS}
        whole = max(sum(totals.values()), 1)
        split = ", ".join(f"{p} {100 * n / whole:.1f}%" for p, n in totals.items() if n)
        more = report.get("steps_not_listed", 0)
        section("bsp", "Execution: BSP view of the last run",
                f"Each executed step's exchange, compute and sync cycles ({len(steps):,} steps"
                + (f", and {more:,} more not listed" if more else "") + f"): {split} of "
                f"{report['cycles']['device']:,} cycles at {target['clock_hz'] / 1e9:.3g} GHz.",
                figure("bsp", _bsp(go, report)))
        rows = _busiest_rows(report)
        sets = [r for r in rows if r["kind"] == "Execute"]
        copies = [r for r in rows if r["kind"] == "Copy"]
        total = max(report["cycles"]["device"], 1)
        set_table = _table(
            ["compute set", "ran", "cycles", "share", "vertices", "tiles", "exchanged", "codelets"],
            [[_code(r["name"]), f"{r['runs']:,}", f"{r['cycles']:,}", f"{100 * r['cycles'] / total:.1f}%",
              f"{r['vertices'] or 0:,}", f"{r['tiles'] or 0:,}", _bytes(r["exchange_bytes"]),
              _e(", ".join(f"{k} x{v}" for k, v in sorted(r["codelets"].items(), key=lambda kv: -kv[1])[:3]))]
             for r in sets[:TOP_STEPS]], numeric={1, 2, 3, 4, 5, 6})
        copy_table = _table(
            ["copy to", "ran", "cycles", "share", "exchanged"],
            [[_code(r["name"]), f"{r['runs']:,}", f"{r['cycles']:,}", f"{100 * r['cycles'] / total:.1f}%",
              _bytes(r["exchange_bytes"])] for r in copies[:TOP_COPIES]], numeric={1, 2, 3, 4})
        in_sets, in_copies = sum(r["cycles"] for r in sets), sum(r["cycles"] for r in copies)
        section("busiest", "Busiest compute sets",
                f"The {min(len(sets), TOP_STEPS)} of {len(sets):,} compute sets that took the most cycles in the "
                f"last run (over all their executions): compute sets took {100 * in_sets / total:.1f}% of the "
                f"run's cycles, copies (exchanges between tiles) {100 * in_copies / total:.1f}%.",
                figure("busiest", _busiest(go, sets)) + set_table
                + (f"<h3>Busiest copies</h3><p class='note'>The {min(len(copies), TOP_COPIES)} of "
                   f"{len(copies):,} copies that took the most cycles.</p>" + copy_table if copies else ""))
    tree = report.get("program_tree")
    if tree:
        # (kind, name, cycles) -> [executions, cycles, tree nodes]: a run
        # names its steps by kind, name and cycles only.
        executed: dict = {}
        for s in report["steps"]:
            ran = executed.setdefault((s["kind"], s["name"], s["cycles"]), [0, 0, 0])
            ran[0] += 1
            ran[1] += s["cycles"]

        def count(node):
            if (node["kind"], node["name"], node.get("cycles")) in executed and not node.get("children"):
                executed[node["kind"], node["name"], node["cycles"]][2] += 1
            for c in node.get("children", []):
                count(c)
        count(tree)
        total = tree.get("cycles", 0)
        section("tree", "Program tree",
                "The program as compiled, with each node's estimated cycles (a Repeat counts its body times its "
                "count, an If or Switch its longest branch) and their share of the whole; compute sets and "
                "copies say what the last run spent in them.",
                f"<div class='tree'><ul>{_tree_html(tree, total, executed)}</ul></div>")
    banner = (f"<div class='banner'><b>This program does not fit in memory.</b> {_e(report.get('error', ''))}</div>"
              if not compiled else
              f"<div class='banner'><b>This program does not fit in memory</b> (compiled with "
              f"allow_out_of_memory): {mem['tiles_over_limit']:,} tiles over the limit.</div>"
              if not mem["fits"] else "")
    data = json.dumps({"program": report["program"], "device": report["device"], "compiled": compiled,
                       "num_tiles": target["num_tiles"], "columns": tile_grid(target["num_tiles"])[0],
                       "figures": sorted(figures)})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}: jax-ipu profile</title>
<style>{CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<header><h1>{_e(title)} <span style="font-weight:400;color:#b8c0d4">on {_e(where)}</span></h1>
<div class="sub">{_e(target['description'])}</div>
<nav>{''.join(nav)}</nav></header>
<main>
{banner}
{_cards(report)}
{''.join(sections)}
<p class="dim">jax-ipu profile report ({_e(report['format'])}); estimates of the IPU Model.</p>
</main>
<script type="application/json" id="jax-ipu-report">{data.replace('</', '<' + chr(92) + '/')}</script>
</body></html>
"""


def write_html(report, path: str) -> str:
    """Writes the page of a report (a dict, or the path of a report's JSON
    file) to `path`; returns the path."""
    from jax_ipu.profile.report import FORMAT
    if isinstance(report, str):
        with open(report) as f:
            report = json.load(f)
    if not isinstance(report, dict) or report.get("format") != FORMAT:
        raise ValueError(f"write_html takes a jax-ipu profile report ({FORMAT}: a dict from "
                         f"jax_ipu.profiling or last_profile, or its JSON file)")
    page = render(report)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
