"""The report page in a real browser: Debian's chromium, headless, driven by
Playwright for Python. Marked `browser`; skipped, saying why, when either is
missing (apt-get install chromium; pip install playwright, in the [test]
extra). JAX_IPU_CHROMIUM names another chromium binary.

    pytest -m browser tests/ipu/profile/test_report_in_browser.py
"""
from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ipu
from helpers import run_python

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("JAX_IPU_CHROMIUM", "/usr/bin/chromium")
# Headless, and nothing the browser would fetch or start by itself.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("plotly", reason="the report page needs plotly (pip install 'jax-ipu[report]')")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright; it is in the [test] extra)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium, or set JAX_IPU_CHROMIUM)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


class Opened:
    """A page opened from a file, with what it logged and requested."""

    def __init__(self, browser, path: str):
        self.page = browser.new_page(viewport={"width": 1320, "height": 1000})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto("file://" + os.path.abspath(path), wait_until="load")
        self.page.wait_for_selector("#fig-tiles .main-svg")

    def hover_tile(self, tile: int) -> str:
        """Moves the mouse over a tile of the heat map; the hover label's text."""
        where = self.page.evaluate("""(tile) => {
            const gd = document.getElementById('fig-tiles');
            const info = JSON.parse(document.getElementById('jax-ipu-report').textContent);
            const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
            gd.scrollIntoView();
            const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
            return {x: box.left + xa.d2p(tile % info.columns), y: box.top + ya.d2p(Math.floor(tile / info.columns))};
        }""", tile)
        self.page.mouse.move(where["x"], where["y"])
        # The label of this tile (not one left from an earlier hover).
        self.page.wait_for_function("""(tile) => {
            const label = document.querySelector('#fig-tiles .hoverlayer .hovertext');
            return label !== null && label.textContent.startsWith(`tile ${tile}:`);
        }""", arg=tile, timeout=5000)
        return self.page.locator("#fig-tiles .hoverlayer .hovertext").text_content()

    def close(self):
        self.page.close()


@pytest.fixture(scope="module")
def mlp_page(tmp_path_factory, ipu):
    rng = np.random.default_rng(0)
    args = [jax.device_put(rng.standard_normal(s).astype(np.float32), ipu) for s in [(64, 128), (128, 10), (32, 64)]]
    jax.jit(lambda w1, w2, x: jnp.tanh(x @ w1) @ w2)(*args).block_until_ready()
    report = jax_ipu.last_profile(ipu)
    path = str(tmp_path_factory.mktemp("page") / "mlp.html")
    jax_ipu.profile.write_html(report, path)
    return report, path


def test_page_loads_offline_and_its_charts_render(browser, mlp_page, tmp_path):
    report, path = mlp_page
    opened = Opened(browser, path)
    page = opened.page
    for figure in ("tiles", "categories", "liveness", "bsp", "busiest"):
        page.wait_for_selector(f"#fig-{figure} .main-svg")
    # Drawn, not just laid out: the heat map's image, bars, lines.
    assert page.locator("#fig-tiles .heatmaplayer image").count() == 1
    assert page.locator("#fig-categories .barlayer .point").count() >= len(report["memory"]["per_tile"]["peak"])
    assert page.locator("#fig-bsp .barlayer .point").count() >= len(report["steps"])
    assert page.locator("#fig-liveness .scatterlayer .trace").count() >= 4
    assert page.locator("#fig-busiest .barlayer .point").count() >= 1
    box = page.locator("#fig-tiles .heatmaplayer image").bounding_box()
    assert box["width"] > 600 and box["height"] > 200
    # The colour scale runs to a tile's memory, or (a button) to the busiest tile.
    zmax = "document.getElementById('fig-tiles').data[0].zmax"
    assert page.evaluate(zmax) * 1024 == report["memory"]["bytes_per_tile"]
    page.get_by_text("scale: busiest tile").click()
    page.wait_for_function(f"{zmax} < 600")
    assert page.evaluate(zmax) * 1024 == pytest.approx(report["memory"]["max_bytes"])
    # The program tree folds and unfolds.
    assert page.locator("#tree details").count() >= 1 and page.locator("#tree li.leaf").count() >= 3
    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    assert opened.errors == []
    # Offline: nothing but the file itself (and what its script makes in place).
    assert all(url.startswith(("file:", "data:", "blob:", "about:")) for url in opened.requests), opened.requests
    opened.close()


def test_hovering_a_tile_shows_its_numbers(browser, mlp_page, tmp_path):
    from jax_ipu.profile.text import _bytes
    report, path = mlp_page
    mem = report["memory"]
    per_tile = mem["per_tile"]
    opened = Opened(browser, path)
    last = len(per_tile["peak"]) - 1
    for tile in (mem["max_tile"], 700, last):
        text = opened.hover_tile(tile)
        assert f"tile {tile}: {_bytes(per_tile['peak'][tile])} of {_bytes(mem['bytes_per_tile'])}" in text, text
        for key in ("arguments", "constants", "code", "not_always_live_peak"):
            assert _bytes(per_tile[key][tile]) in text, (key, text)
    opened.page.screenshot(path=str(tmp_path / "hover.png"))
    assert (tmp_path / "hover.png").stat().st_size > 20_000
    assert opened.errors == []
    opened.close()


def test_page_of_a_program_over_the_limit(browser, tmp_path):
    from jax_ipu.profile.text import _bytes
    code = f"""
import jax, jax.numpy as jnp, numpy as np, jax_ipu
x = jax.device_put(np.zeros((1024, 1024), np.float32), jax.devices("ipu")[0])
with jax_ipu.profiling({str(tmp_path)!r}, html=True):
    jax.jit(lambda a: jnp.tanh(a * 2 + 1))(x).block_until_ready()
"""
    done = run_python(code, JAX_IPU_MODEL_NUM_TILES="4", JAX_IPU_ALLOW_OUT_OF_MEMORY="1")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "jit__lambda-0.json").read_text())
    mem = report["memory"]
    opened = Opened(browser, str(tmp_path / "jit__lambda-0.html"))
    worst = mem["over_limit"][0]
    text = opened.hover_tile(worst["tile"])
    assert f"tile {worst['tile']}: {_bytes(worst['peak'])}" in text and f"over the limit by {_bytes(worst['over'])}" in text
    over = opened.page.locator("#over tbody tr")
    assert over.count() == mem["tiles_over_limit"]
    assert opened.page.locator("#fig-tiles .scatterlayer .point").count() == mem["tiles_over_limit"]
    opened.page.screenshot(path=str(tmp_path / "over.png"), full_page=True)
    assert opened.errors == []
    opened.close()
