"""``/debug/ui`` in a real headless Chromium, served by the real ``koordlet`` on a moving fake node.

The page must render, its charts must fill with the cache's samples within a few polls (and be
drawn: the node line's colour is on the canvas), the strategies and the dry-run evictions must
show, and the browser must log no console error, uncaught exception or refused load (the page's
Content-Security-Policy refuses anything from elsewhere, and Chromium logs each refusal).

``KOORDLET_UI_SCREENSHOT=docs/images/debug-ui.png`` makes the test write its screenshot there
(how the one in docs/ was made); otherwise it goes to the test's temporary folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.ui.cdp import Page, chromium, find_chromium
from tests.ui.demo import Daemon, DemoNode, koordlet, write_nodeslo

pytestmark = pytest.mark.daemon

CHROMIUM = find_chromium()
NEED_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (scripts/dev.sh test installs it with apt-get; "
    "this machine could not)",
)
CPUS = 8
THRESHOLD = {
    "enable": True,
    "cpuSuppressThresholdPercent": 65,
    # The fake node uses 25 % of its memory: above 20 %, memory eviction picks BE pods (in dry
    # run, so that the page has decisions to show and nothing is killed).
    "memoryEvictThresholdPercent": 20,
}
NODE_BLUE = (0x25, 0x63, 0xEB)
"""The colour the page draws node usage in (``#2563eb``)."""

CHART_LINES = """(() => {
  const out = {};
  for (const [id, c] of Object.entries(window.koordletUI.charts)) {
    out[id] = {lines: {}, levels: {}};
    for (const [key, l] of c.lines) out[id].lines[key] = l.points.length;
    for (const lv of c.levels) out[id].levels[lv.label] = lv.value;
  }
  return out;
})()"""


def count_colour(canvas_id: str, rgb: tuple[int, int, int]) -> str:
    """JS counting the canvas pixels within a small distance of ``rgb``."""
    r, g, b = rgb
    return f"""(() => {{
  const c = document.getElementById({canvas_id!r});
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (Math.abs(d[i] - {r}) + Math.abs(d[i + 1] - {g}) + Math.abs(d[i + 2] - {b}) < 60
        && d[i + 3] > 200) n += 1;
  return n;
}})()"""


@contextlib.asynccontextmanager
async def moving(node: DemoNode) -> AsyncIterator[None]:
    """Advance the node's counters every 50 ms of real time while the block runs."""

    async def run() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            await asyncio.to_thread(node.advance, now - last)
            last = now

    task = asyncio.create_task(run(), name="demo-load")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(page: Page, what: str, expression: str, within: float = 30.0) -> Any:
    """Evaluate ``expression`` until it is truthy; fail naming ``what`` (with the page's errors)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await page.evaluate(expression)
        if value:
            return value
        await asyncio.sleep(0.2)
    errors = await page.evaluate("window.koordletUI ? window.koordletUI.errors : 'no koordletUI'")
    pytest.fail(f"no {what} within {within:g}s; page errors: {errors}; console: {page.console}")


async def open_ui(daemon: Daemon, page: Page, query: str) -> None:
    loaded = await page.send("Page.navigate", url=f"{daemon.base}/debug/ui?{query}")
    assert "errorText" not in loaded, loaded
    await until(page, "page script", "typeof window.koordletUI === 'object'")


@NEED_CHROMIUM
async def test_the_page_renders_live_charts_decisions_and_evictions_without_console_errors(
    host_root: Path, tmp_path: Path
) -> None:
    assert CHROMIUM is not None
    node = DemoNode(host_root, pods=12, ncpus=CPUS)
    slo = write_nodeslo(tmp_path / "nodeslo.yaml", THRESHOLD)
    # CPU suppress writes the fake tree's BE cpuset (the allowance line follows it); memory
    # eviction only decides.
    args = node.args(
        *("--qos-dry-run-strategies", "memoryevict"),
        *("--feature-gates", "BEMemoryEvict=true"),
        "--nodeslo-file",
        str(slo),
        "--collect-res-used-interval-seconds",
        "200ms",
    )
    with koordlet(args, tmp_path) as daemon:
        async with moving(node), chromium(CHROMIUM) as browser:
            page = await browser.new_page()
            await open_ui(
                daemon, page, os.environ.get("KOORDLET_UI_QUERY", "interval=0.5&window=60")
            )

            await until(page, "five polls", "window.koordletUI.ticks >= 5")
            charts = await until(
                page,
                "three points in every line of every chart",
                f"""(() => {{ const c = {CHART_LINES};
                  return Object.values(c).every(x => Object.keys(x.lines).length
                    && Object.values(x.lines).every(n => n >= 3)) ? c : null; }})()""",
            )
            await until(page, "a dry-run eviction", "window.koordletUI.evictions.length > 0")

            assert set(charts["cpu"]["lines"]) == {"node", "system", "be", "allowance"}
            assert set(charts["mem"]["lines"]) == {"node", "cache"}
            classes = {"class:LSR", "class:LS", "class:BE"}
            assert set(charts["qcpu"]["lines"]) == {"system", *classes}
            assert set(charts["qmem"]["lines"]) == {"system", *classes}
            # The NodeSLO's thresholds as levels: 65 % of 8 CPUs, 20 % of the node's memory.
            summary = daemon.json("/debug/summary")
            assert charts["cpu"]["levels"]["suppress threshold 65%"] == pytest.approx(0.65 * CPUS)
            assert charts["cpu"]["levels"]["capacity"] == CPUS
            memory = summary["capacity"]["memory_bytes"]
            assert charts["mem"]["levels"]["evict threshold 20%"] == pytest.approx(0.2 * memory)
            # Drawn, not only held: the node line's blue is on the CPU chart's canvas.
            assert await page.evaluate(count_colour("c-cpu", NODE_BLUE)) > 50

            rows = await page.evaluate(
                "[...document.querySelectorAll('#strategies tr')]"
                ".map(tr => [...tr.cells].map(td => td.textContent))"
            )
            running = daemon.json("/debug/qos")["strategies"]
            assert {r[0] for r in rows} >= set(running)
            memoryevict = next(r for r in rows if r[0] == "memoryevict")
            assert "dry run" in memoryevict[1]
            evictions = await page.evaluate(
                "[...document.querySelectorAll('#evictions tr')].map(tr => tr.textContent)"
            )
            assert any("dry run" in e and "BE" in e for e in evictions), evictions
            tiles = await page.evaluate(
                "[...document.querySelectorAll('.tile .value')].map(v => v.textContent)"
            )
            assert "\u2013" not in tiles, tiles  # the dash of a value not known yet
            dry = await page.evaluate(
                "[document.getElementById('dry')].map(e => [e.className, e.textContent])[0]"
            )
            assert dry == ["badge warn", "DRY RUN: memoryevict"]
            assert await page.evaluate("window.koordletUI.errors") == []
            assert page.errors() == []

            target = os.environ.get("KOORDLET_UI_SCREENSHOT")
            if target:  # docs/images: let the charts fill for a while, then take the whole page
                await asyncio.sleep(float(os.environ.get("KOORDLET_UI_SCREENSHOT_WAIT", "0")))
            height = await page.evaluate("document.documentElement.scrollHeight")
            await page.send(
                "Emulation.setDeviceMetricsOverride",
                width=1400,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            await asyncio.sleep(0.2)  # the resize redraws the charts
            png = await page.screenshot()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 20_000
    await asyncio.to_thread(Path(target or tmp_path / "debug-ui.png").write_bytes, png)


@NEED_CHROMIUM
async def test_the_page_loads_nothing_from_elsewhere(host_root: Path, tmp_path: Path) -> None:
    """Its policy allows this server only: an injected load from elsewhere is refused and
    logged, which is how the test above would see an external asset."""
    assert CHROMIUM is not None
    node = DemoNode(host_root, pods=2, ncpus=2)
    with koordlet(node.args(), tmp_path) as daemon:
        async with chromium(CHROMIUM) as browser:
            page = await browser.new_page()
            await open_ui(daemon, page, "interval=1")
            refused = await page.evaluate(
                "fetch('http://192.0.2.1/x.js').then(() => 'loaded', () => 'refused')"
            )
            assert refused == "refused"
            await until(page, "a first poll", "window.koordletUI.ticks >= 1")
            # The refusal is a console error: the policy is enforced, and visible to the test.
            for _ in range(100):
                if page.errors():
                    break
                await asyncio.sleep(0.1)
            assert any("Content Security Policy" in e.text for e in page.errors()), page.console
