"""The report's views for the page (liveness, program tree, tiles over the
limit, the largest tensor per tile) and the HTML page itself, read without
a browser (tests/ipu/profile/test_report_in_browser.py opens it in one)."""
from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ipu
from helpers import run_python
from jax_ipu import cli
from jax_ipu.graph.programs import Copy, Execute, leaves


def mlp(w1, w2, x):
    return jnp.tanh(x @ w1) @ w2


@pytest.fixture(scope="module")
def mlp_report(ipu):
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal(s).astype(np.float32), ipu) for s in [(64, 128), (128, 10), (32, 64)]]
    jax.jit(mlp)(*args).block_until_ready()
    return jax_ipu.last_profile(ipu)


def _program(ipu):
    from jax_ipu.pjrt import client
    return client.CURRENT.device(ipu.id).last_program


def test_liveness_adds_up_to_the_memory_plan(ipu, mlp_report):
    mem = mlp_report["memory"]
    live = mem["liveness"]
    n = len(live["not_always_live"])
    assert n >= 3 and len(live["steps"]) == len(live["exchange_buffers"]) == len(live["on_max_tile"]) == n
    # The busiest tile's not-always-live peak is the peak over steps of its liveness.
    assert max(live["on_max_tile"]) == mem["per_tile"]["not_always_live_peak"][mem["max_tile"]]
    at = live["peak_step"]
    assert live["peak_bytes"] == live["not_always_live"][at] == max(live["not_always_live"]) > 0
    assert all(0 <= e <= t for e, t in zip(live["exchange_buffers"], live["not_always_live"], strict=True))
    # What is live at the peak: the tensors listed (all of them here) and the exchange buffers.
    assert live["tensors_at_peak_not_listed"] == 0
    tensors = live["tensors_at_peak"]
    assert sum(t["bytes"] for t in tensors) + live["exchange_buffers"][at] == live["peak_bytes"]
    assert [t["bytes"] for t in tensors] == sorted((t["bytes"] for t in tensors), reverse=True)
    for t in tensors:
        assert t["bytes"] == int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize
    # The steps are the program's top-level steps, named as the run names them.
    executed = {s["name"] for s in mlp_report["steps"]}
    assert {s["name"] for s in live["steps"] if s["kind"] in ("Execute", "Copy")} <= executed


def test_largest_tensor_per_tile(mlp_report):
    mem = mlp_report["memory"]
    per_tile, names = mem["per_tile"], mem["largest_tensor_names"]
    tiles = len(per_tile["peak"])
    assert len(per_tile["largest_tensor"]) == len(per_tile["largest_tensor_bytes"]) == tiles
    for t in range(tiles):
        index, nbytes = per_tile["largest_tensor"][t], per_tile["largest_tensor_bytes"][t]
        assert (index == -1) == (nbytes == 0)
        # A tensor's bytes on a tile count in its peak (always-live, or live at some step).
        assert nbytes <= per_tile["peak"][t]
    top = mem["largest_tensors_on_max_tile"][0]
    t = mem["max_tile"]
    assert names[per_tile["largest_tensor"][t]] == top["name"]
    assert per_tile["largest_tensor_bytes"][t] == top["bytes_on_tile"]


def test_program_tree_counts_as_the_static_estimate(ipu):
    def f(x):
        x = jax.lax.fori_loop(0, 7, lambda i, x: jnp.sin(x) * 1.5, x)
        return jax.lax.while_loop(lambda x: x.sum() < 1e3, lambda x: x * 2.0 + 1.0, x)

    jax.jit(f)(jax.device_put(np.ones(256, np.float32), ipu)).block_until_ready()
    report = jax_ipu.last_profile(ipu)
    tree = report["program_tree"]
    assert tree["kind"] == "Sequence" and tree["name"] == report["program"]
    assert tree["cycles"] == report["static_estimate"]["cycles"]

    def nodes(node):
        yield node
        for c in node.get("children", []):
            yield from nodes(c)

    everything = list(nodes(tree))
    (repeat,) = [n for n in everything if n["kind"] == "Repeat"]
    # A loop's own control (a Repeat's counter and branch; a RepeatWhileTrue's
    # predicate broadcast to every tile after a sync) is counted per decision.
    counter = repeat["control"]["cycles"]
    assert counter > 0 and repeat["control"]["sync_cycles"] == 0
    assert repeat["count"] == 7 and repeat["cycles"] == 7 * (sum(c["cycles"] for c in repeat["children"]) + counter)
    (loop,) = [n for n in everything if n["kind"] == "RepeatWhileTrue"]
    condition, body = loop["children"]
    assert (condition["name"], body["name"]) == ("condition", "body")
    test = loop["control"]
    assert test["sync_cycles"] > 0 and test["exchange_cycles"] > 0 and test["cycles"] > counter
    assert loop["cycles"] == condition["cycles"] + test["cycles"]
    (unknown,) = report["static_estimate"]["unknown_trip_loops"]
    assert loop["cycles_per_iteration"] == unknown["cycles_per_iteration"] == \
        condition["cycles"] + body["cycles"] + test["cycles"]
    per_iteration = loop["per_iteration"]
    assert per_iteration["control_cycles"] == test["cycles"] and per_iteration["syncs"] >= 2
    # Every compute set and copy of the program is a leaf, in program order.
    program = _program(ipu)
    expected = [(type(s).__name__, s.cycles) for s in leaves(program.body) if isinstance(s, (Execute, Copy))]
    assert [(n["kind"], n["cycles"]) for n in everything if n["kind"] in ("Execute", "Copy")] == expected
    streams = [n for n in everything if n["kind"] in ("HostToDevice", "DeviceToHost")]
    assert len(streams) == 2 and sum(n["host_cycles"] for n in streams) == report["cycles"]["host"]


def test_steps_sharing_a_name_keep_their_own_phases(ipu):
    # One function traced twice at one source line: two copies of one name.
    def g(x):
        return jnp.transpose(x) * 2.0

    a, b = np.ones((4, 8), np.float32), np.ones((256, 512), np.float32)
    jax.block_until_ready(jax.jit(lambda a, b: (g(a), g(b)))(*jax.device_put((a, b), ipu)))
    steps = jax_ipu.last_profile(ipu)["steps"]
    copies = [s for s in steps if s["kind"] == "Copy"]
    assert len(copies) == 2 and copies[0]["name"] == copies[1]["name"] and copies[0]["cycles"] != copies[1]["cycles"]
    program = _program(ipu)
    run = [s for s in leaves(program.body) if isinstance(s, (Execute, Copy))]
    assert [(s["exchange_cycles"], s["sync_cycles"]) for s in steps] == [(s.exchange_cycles, s.sync_cycles)
                                                                         for s in run]
    for copy in copies:       # a copy is all exchange (and on-tile copying) and a sync
        assert copy["exchange_cycles"] + copy["sync_cycles"] == copy["cycles"]


# -- the page ------------------------------------------------------------------

def figures(page: str) -> dict:
    """{div id: (data, layout)} of the page's plotly figures, read from the
    Plotly.newPlot calls plotly.io.to_html writes."""
    decoder = json.JSONDecoder()
    out = {}
    for match in re.finditer(r"Plotly\.newPlot\(\s*", page):
        at = match.end()
        div, at = decoder.raw_decode(page, at)
        parts = []
        for _ in range(2):
            at = re.compile(r"\s*,\s*").match(page, at).end()
            value, at = decoder.raw_decode(page, at)
            parts.append(value)
        out[div] = tuple(parts)
    return out


@pytest.fixture(scope="module")
def mlp_page(mlp_report):
    pytest.importorskip("plotly", reason="the report page needs plotly (pip install 'jax-ipu[report]')")
    from jax_ipu.profile.html import render
    return render(mlp_report)


def test_page_is_self_contained(mlp_page):
    from plotly.offline import get_plotlyjs
    assert mlp_page.startswith("<!DOCTYPE html>") and mlp_page.rstrip().endswith("</html>")
    assert mlp_page.count(get_plotlyjs()) == 1           # plotly.js inlined once
    # Nothing is fetched: no script or style sources, no remote URLs in attributes.
    assert not re.search(r"<script[^>]*\bsrc=", mlp_page)
    assert not re.search(r"<link[^>]*\bhref=", mlp_page)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", mlp_page.replace(get_plotlyjs(), ""))
    sections = re.findall(r"<section id='([\w-]+)'>", mlp_page)
    assert sections == ["tiles", "liveness", "bsp", "busiest", "tree"]
    info = json.loads(re.search(r'<script type="application/json" id="jax-ipu-report">(.*?)</script>',
                                mlp_page, re.S).group(1))
    assert info["program"] == "jit_mlp" and info["figures"] == sorted(figures(mlp_page)) == sorted(
        ["fig-tiles", "fig-categories", "fig-liveness", "fig-bsp", "fig-busiest"])


def test_heat_map_holds_every_tile(mlp_report, mlp_page):
    from jax_ipu.profile.html import tile_grid
    from jax_ipu.profile.text import _bytes
    mem = mlp_report["memory"]
    per_tile = mem["per_tile"]
    data, layout = figures(mlp_page)["fig-tiles"]
    (heat,) = [d for d in data if d["type"] == "heatmap"]
    columns, rows = tile_grid(len(per_tile["peak"]))
    assert (columns, rows) == (64, 23) and len(heat["z"]) == rows and heat["zmax"] * 1024 == mem["bytes_per_tile"]
    for t, peak in enumerate(per_tile["peak"]):
        r, c = divmod(t, columns)
        assert heat["z"][r][c] * 1024 == pytest.approx(peak)
    t = mem["max_tile"]
    r, c = divmod(t, columns)
    text = heat["text"][r][c]
    assert text.startswith(f"<b>tile {t}</b>: {_bytes(per_tile['peak'][t])} of {_bytes(mem['bytes_per_tile'])}")
    for key in ("arguments", "constants", "code", "not_always_live_peak"):
        assert _bytes(per_tile[key][t]) in text
    top = mem["largest_tensors_on_max_tile"][0]
    assert f"largest tensor       {_bytes(top['bytes_on_tile']):>10}" in text
    # The bars by category add up to each tile's peak.
    bars, _ = figures(mlp_page)["fig-categories"]
    assert [b["name"] for b in bars] == ["arguments", "constants", "code and vertex state", "not-always-live peak"]
    scale = per_tile["peak"][t] / sum(b["y"][t] for b in bars)
    np.testing.assert_allclose(np.sum([b["y"] for b in bars], axis=0) * scale, per_tile["peak"], rtol=1e-9)


def test_bsp_and_liveness_figures_add_up(mlp_report, mlp_page):
    data, _ = figures(mlp_page)["fig-bsp"]
    steps = mlp_report["steps"]
    assert {d["name"] for d in data} <= {"compute", "exchange", "sync", "host callback, stream"}
    np.testing.assert_array_equal(np.sum([d["y"] for d in data], axis=0), [s["cycles"] for s in steps])
    exchange = next(d for d in data if d["name"] == "exchange")["y"]
    assert exchange == [s["exchange_cycles"] for s in steps]
    data, layout = figures(mlp_page)["fig-liveness"]
    live = mlp_report["memory"]["liveness"]
    tensors, buffers = data[0]["y"], data[1]["y"]
    scale = live["peak_bytes"] / (tensors[live["peak_step"]] + buffers[live["peak_step"]])
    np.testing.assert_allclose((np.array(tensors) + buffers) * scale, live["not_always_live"], rtol=1e-9)
    peak = next(d for d in data if d["name"] == "peak")
    assert peak["x"] == [live["peak_step"]]


def test_busiest_and_tree_sections(mlp_report, mlp_page):
    from jax_ipu.profile.html import short
    busiest = mlp_page[mlp_page.index("<section id='busiest'>"):mlp_page.index("<section id='tree'>")]
    slowest = max(mlp_report["steps"], key=lambda s: s["cycles"])
    assert f"{slowest['cycles']:,}" in busiest
    tree = mlp_page[mlp_page.index("<section id='tree'>"):]
    for cs in mlp_report["compute_sets"]:
        assert f"title='{cs['name']}'>{short(cs['name'])}</code>" in tree or cs["name"] != short(cs["name"])
    assert f"{mlp_report['program_tree']['cycles']:,}" in tree


def test_short_names_drop_directories():
    from jax_ipu.profile.html import short
    assert (short("convolution@/home/me/proj/model.py:31:27 (jit(step)/conv in Block.__call__)")
            == "convolution@model.py:31 (jit(step)/conv in Block.__call__)")
    assert short("argument 0") == "argument 0"
    from jax_ipu.profile.html import brief
    assert (brief("matmul convolution@/a/m.py:34:23 (jit(step)/transpose(jvp(Net))/Block_1/Conv_2/conv in "
                  "Block.__call__) 1x1024x1x1 tiles") == "matmul convolution Block_1/Conv_2/conv (backward)")
    assert brief("fused multiply+add @/a/m.py:71:15 (jit(step)/add in main.<locals>.step)") == "fused multiply+add add"
    assert brief("argument 0") == "argument 0"
    assert (brief("convolution@/a/m.py:31:27 (jit(step)/transpose(jvp(Net))/Block_1/Conv_0/conv in f)", where=True)
            == "convolution@m.py:31 Block_1/Conv_0/conv (backward)")


def test_write_html_from_python_and_the_command(tmp_path, ipu, capsys):
    pytest.importorskip("plotly", reason="the report page needs plotly (pip install 'jax-ipu[report]')")
    x = jax.device_put(np.ones((16, 16), np.float32), ipu)
    with jax_ipu.profiling(str(tmp_path / "prof"), html=True):
        jax.jit(lambda a: jnp.tanh(a @ a))(x).block_until_ready()
    assert sorted(p.name for p in (tmp_path / "prof").iterdir()) == [
        "jit__lambda-0.html", "jit__lambda-0.json", "jit__lambda-0.trace.json"]
    report = str(tmp_path / "prof" / "jit__lambda-0.json")
    assert jax_ipu.profile.write_html(report, str(tmp_path / "a.html")) == str(tmp_path / "a.html")
    assert (tmp_path / "a.html").read_text() == (tmp_path / "prof" / "jit__lambda-0.html").read_text()
    assert cli.main(["report", "--html", str(tmp_path / "pages"), str(tmp_path / "prof")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "pages" / "jit__lambda-0.html")]
    assert (tmp_path / "pages" / "jit__lambda-0.html").read_text() == (tmp_path / "a.html").read_text()
    with pytest.raises(ValueError, match="jax-ipu profile report"):
        jax_ipu.profile.write_html({"traceEvents": []}, str(tmp_path / "b.html"))


OVER_LIMIT = """
import json, re, jax, jax.numpy as jnp, numpy as np, jax_ipu
x = jax.device_put(np.zeros((512, 1024), np.float32), jax.devices("ipu")[0])   # fits; with its result it does not
{body}
"""


def test_page_of_a_program_over_the_limit(tmp_path):
    pytest.importorskip("plotly", reason="the report page needs plotly (pip install 'jax-ipu[report]')")
    body = (f"with jax_ipu.profiling({str(tmp_path)!r}, html=True):\n"
            "    jax.jit(lambda a: jnp.tanh(a * 2 + 1))(x).block_until_ready()")
    done = run_python(OVER_LIMIT.format(body=body), JAX_IPU_MODEL_NUM_TILES="4", JAX_IPU_ALLOW_OUT_OF_MEMORY="1")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "jit__lambda-0.json").read_text())
    mem = report["memory"]
    assert report["compiled"] and not mem["fits"]
    over = mem["over_limit"]
    assert len(over) == mem["tiles_over_limit"] >= 1
    assert [o["over"] for o in over] == sorted((o["over"] for o in over), reverse=True)
    for o in over:
        assert o["peak"] == mem["per_tile"]["peak"][o["tile"]] == o["always_live"] + o["not_always_live_peak"]
        assert o["over"] == o["peak"] - mem["bytes_per_tile"] > 0
        assert o["tensors"] and sum(t["bytes_on_tile"] for t in o["tensors"]) <= o["peak"]
        assert o["tensors"][0]["shape"] == [512, 1024]
    page = (tmp_path / "jit__lambda-0.html").read_text()
    assert "This program does not fit in memory</b> (compiled with allow_out_of_memory)" in page
    section = page[page.index("<section id='over'>"):page.index("<section id='tiles'>")]
    for o in over:
        assert f"<td class='num'>{o['tile']}</td>" in section
    data, _ = figures(page)["fig-tiles"]
    (marks,) = [d for d in data if d["name"] == "over the limit"]
    assert sorted(zip(marks["y"], marks["x"], strict=True)) == sorted(divmod(o["tile"], 4) for o in over)


def test_page_of_a_program_that_did_not_compile(tmp_path):
    pytest.importorskip("plotly", reason="the report page needs plotly (pip install 'jax-ipu[report]')")
    body = (f"with jax_ipu.profiling({str(tmp_path)!r}, html=True):\n"
            "    try:\n        jax.jit(lambda a: jnp.tanh(a * 2 + 1))(x)\n"
            "    except Exception as exc:\n        print('ERROR', type(exc).__name__)")
    done = run_python(OVER_LIMIT.format(body=body), JAX_IPU_MODEL_NUM_TILES="4")
    assert done.returncode == 0 and "ERROR" in done.stdout, done.stderr
    page = (tmp_path / "jit__lambda-0.html").read_text()
    assert "This program does not fit in memory.</b> out of memory on tile" in page
    sections = re.findall(r"<section id='([\w-]+)'>", page)
    assert sections == ["over", "tiles", "liveness", "tree"]      # no run: no BSP view
