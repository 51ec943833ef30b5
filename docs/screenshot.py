"""Screenshots of a profile's report page, as in docs/images/ (headless
chromium through Playwright, as tests/ipu/profile/test_report_in_browser.py runs it).

    python examples/profile_report.py --out profile
    python docs/screenshot.py profile/jit_train_step-0.html docs/images/profile-report

writes PREFIX-memory.png (the top of the page: figures, memory per tile
with one tile's hover label, liveness) and PREFIX-execution.png (the BSP
view and the busiest compute sets).
"""
import argparse
import os

from playwright.sync_api import sync_playwright

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("page")
    parser.add_argument("prefix")
    parser.add_argument("--chromium", default=os.environ.get("JAX_IPU_CHROMIUM", "/usr/bin/chromium"))
    parser.add_argument("--tile", type=int, default=None, help="the tile to hover over (default: the busiest)")
    args = parser.parse_args(argv)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1320, "height": 1000}, device_scale_factor=1)
        page.goto("file://" + os.path.abspath(args.page), wait_until="load")
        page.wait_for_selector("#fig-liveness .main-svg")

        def top(selector: str) -> float:
            return page.evaluate(f"document.querySelector('{selector}').getBoundingClientRect().top + window.scrollY")

        def bottom(selector: str) -> float:
            return page.evaluate(f"document.querySelector('{selector}').getBoundingClientRect().bottom"
                                 " + window.scrollY")

        # Hover over a tile of the heat map, so that its label shows.
        where = page.evaluate("""(tile) => {
            const gd = document.getElementById('fig-tiles');
            const info = JSON.parse(document.getElementById('jax-ipu-report').textContent);
            if (tile === null) {
                const z = gd.data[0].z.flat();
                tile = z.indexOf(Math.max(...z.filter(v => v !== null)));
            }
            const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
            const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
            return {x: box.left + xa.d2p(tile % info.columns) + window.scrollX,
                    y: box.top + ya.d2p(Math.floor(tile / info.columns)) + window.scrollY};
        }""", args.tile)
        page.set_viewport_size({"width": 1320, "height": int(bottom("#fig-liveness")) + 20})
        page.mouse.move(where["x"], where["y"])
        page.wait_for_selector("#fig-tiles .hoverlayer .hovertext")
        page.screenshot(path=args.prefix + "-memory.png",
                        clip={"x": 0, "y": 0, "width": 1320, "height": bottom("#fig-liveness") + 16})
        page.mouse.move(0, 0)
        start, end = top("#bsp"), bottom("#fig-busiest")
        page.set_viewport_size({"width": 1320, "height": int(end) + 20})
        page.screenshot(path=args.prefix + "-execution.png",
                        clip={"x": 0, "y": start - 12, "width": 1320, "height": end - start + 16})
        browser.close()
    print(args.prefix + "-memory.png", args.prefix + "-execution.png")


if __name__ == "__main__":
    main()
