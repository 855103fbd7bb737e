"""``python -m tests.web.screenshots DIR``: the jobs list and the 4,096-tile job of
``docs/web.md`` (``docs/web/jobs.png``, ``job.png``).

Drawn by headless Chromium from contract-shaped replies (:mod:`tests.web.fakefarm`, with plain
names instead of the tests' hostile text): a list of 50 jobs and a 4,096-tile grid, which a
test farm would take long to produce. The other pictures (``job-live.png``, ``dlq.png``,
``workers.png``) are the browser test's of a real ``tessera up`` run
(``TESSERA_SCREENSHOTS=DIR pytest tests/web/test_browser.py -k whole_flow``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from playwright.async_api import Page

from tests.helpers import eventually
from tests.web.browser import chromium
from tests.web.fakefarm import JOB_ID, FakeFarm
from tests.web.pagesapp import pages_app, serving

PAGES = {
    "jobs.png": ("/", "#jobs .progress-cell .progress"),
    "job.png": (f"/jobs/{JOB_ID}", "#timeline tbody tr"),
}


async def _holds(page: Page, expression: str, what: str) -> None:
    async def check() -> bool:
        return bool(await page.evaluate(expression))

    await eventually(check, what=what)


async def take(out: Path) -> list[Path]:
    """Each page's screenshot in ``out`` (an existing directory); their paths."""
    farm = FakeFarm(
        text="studio-a",
        error="kernel_failure: scene mesh 'teapot.obj' has a face with 2 vertices (line 118)",
        node="render-07",
    )
    saved = []
    async with serving(pages_app()) as server, chromium() as browser:
        ctx = await browser.new_context(
            viewport={"width": 1280, "height": 860},
            extra_http_headers={"X-Test-Role": "operator", "X-Test-Csrf": "docs"},
        )
        for name, (path, ready) in PAGES.items():
            page = await ctx.new_page()
            await farm.install(page)
            await page.goto(str(server.make_url(path)))
            await page.locator(ready).first.wait_for()
            if name == "jobs.png":
                await _holds(page, "!document.querySelector('#jobs .muted')", "every progress")
            if name == "job.png":
                box = await page.locator("#tiles").bounding_box()
                assert box is not None
                await page.mouse.click(box["x"] + box["width"] - 3, box["y"] + box["height"] - 3)
                await _holds(page, "document.getElementById('preview').naturalWidth", "preview")
            await page.screenshot(path=out / name, full_page=name != "jobs.png")
            saved.append(out / name)
            await page.close()
        await ctx.close()
    return saved


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/web")
    target.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(take(target)):
        print(path)
