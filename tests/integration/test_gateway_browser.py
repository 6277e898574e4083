"""Gateway web terminal, end to end in headless Chromium (Debian's package, driven by
Playwright; no browser is ever downloaded): list sandboxes, open a terminal, type, resize, drop
the socket and see the earlier output redrawn after the reconnect."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from gateway_harness import GatewayFactory, lifecycle_prefix, mint_key, start_gateway  # noqa: F401
from playwright.async_api import Page, async_playwright

__all__: list[str] = []

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
XTERM = Path(__file__).parents[2] / "services/gateway/src/sandpod_gateway/web/node_modules"


async def _screen(page: Page) -> str:
    text: str = await page.evaluate("""() => {
        const b = window.sandpodTerm.buffer.active; const out = [];
        for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));
        return out.join("\\n"); }""")
    return text


async def _wait_screen(page: Page, needle: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while needle not in (text := await _screen(page)):
        assert time.monotonic() < deadline, f"{needle!r} not on screen:\n{text}"
        await page.wait_for_timeout(50)
    return text


async def test_web_terminal_in_chromium(
    start_gateway: GatewayFactory, lifecycle_prefix: str
) -> None:
    """Open the page, pick the sandbox, type `echo hi`, see `hi`; resize; drop the socket,
    reconnect, and the earlier output is on screen again."""
    assert Path(CHROMIUM).exists(), "install Debian's chromium (make web / .ci/run does)"
    assert (XTERM / "@xterm/xterm/lib/xterm.mjs").exists(), "run `make web` (npm ci)"
    gw = await start_gateway(prefix=lifecycle_prefix)
    key = await mint_key(gw, "web")
    async with gw.client(key) as c:
        deadline = time.monotonic() + 20
        create = {"metadata": {"name": "term"}, "wait": 60}
        while (r := await c.post("/v1/sandboxes", json=create)).status_code == 503:
            assert time.monotonic() < deadline, "lifecycle never answered"
            await asyncio.sleep(0.05)
        assert r.status_code == 201, r.text
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            try:
                page = await browser.new_page(viewport={"width": 900, "height": 600})
                await page.goto(f"{gw.url}/terminal#key={key}")
                await page.wait_for_selector("#sandboxes option[value=term]", state="attached")
                await page.click("#open")
                await page.wait_for_function(
                    "document.body.dataset.status?.startsWith('connected')"
                )
                await page.click("#term")
                await page.keyboard.type("echo h''i-$((6*7))\n")
                await _wait_screen(page, "hi-42")
                before = await page.evaluate("window.sandpodTerm.cols")
                await page.set_viewport_size({"width": 500, "height": 400})
                await page.wait_for_function(f"window.sandpodTerm.cols < {before}")
                cols = await page.evaluate("window.sandpodTerm.cols")
                await page.keyboard.type("stty size\n")
                await _wait_screen(page, f" {cols}\n")
                await page.evaluate("window.sandpodDrop()")
                await page.wait_for_function(
                    "document.body.dataset.status?.startsWith('reconnecting')"
                )
                await page.wait_for_function(
                    "document.body.dataset.status?.startsWith('connected')"
                )
                await _wait_screen(page, "hi-42")  # redrawn from the replay buffer
                await page.keyboard.type("exit\n")
                await page.wait_for_function("document.body.dataset.status?.startsWith('exited')")
            finally:
                await browser.close()
        await c.delete("/v1/sandboxes/term", params={"wait": 30})
