"""The console in a real browser: headless Chromium (Debian's, driven by Playwright).

Two halves. The pages alone (an app with just ``services.web.pages``; Playwright answers the
page's ``/api`` requests with contract-shaped replies from :mod:`tests.web.fakefarm`): the
script writes hostile text as text, draws a 4,096-tile grid on a canvas and applies the SSE
deltas, pages with ``after``, and sends the CSRF token. Then the whole flow against ``tessera
up``: submit from the page, watch the grid fill and the preview sharpen, pause and resume, cancel
another job, requeue a dead letter. Screenshots go to the test's tmp dir (path printed).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.async_api import Browser, BrowserContext, Page

from shared.devstack.procs import free_port
from tests.helpers import eventually, eventually_sync
from tests.pngread import read_png
from tests.test_up import Up, running_up
from tests.web.browser import chromium
from tests.web.fakefarm import HOSTILE, JOB_ID, FakeFarm
from tests.web.pagesapp import pages_app, serving

#: seconds a page may take to show something (Chromium shares 2 cores with the suite)
WAIT = 30.0
#: tile state colours of console.js, as RGB
DONE, QUEUED, FAILED = (0x2E, 0x9E, 0x5B), (0x5A, 0x62, 0x70), (0xC0, 0x39, 0x2B)


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


@pytest.fixture
def shots(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """Where a test saves its screenshots: the tmp dir, or ``$TESSERA_SCREENSHOTS/<test>``
    (pytest keeps only its last few tmp dirs)."""
    keep = os.environ.get("TESSERA_SCREENSHOTS")
    path = Path(keep) / request.node.name if keep else tmp_path / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {path}")
    return path


@pytest.fixture
async def pages_url() -> AsyncIterator[str]:
    async with serving(pages_app()) as server:
        yield str(server.make_url("")).rstrip("/")


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    ctx = await browser.new_context(
        viewport={"width": 1280, "height": 900},
        extra_http_headers={"X-Test-Role": "operator", "X-Test-Csrf": "csrf-123"},
    )
    try:
        yield ctx
    finally:
        await ctx.close()


#: uncaught errors of each page's script
_ERRORS: dict[Page, list[str]] = {}


async def _open(context: BrowserContext, url: str, farm: FakeFarm) -> Page:
    page = await context.new_page()
    errors = _ERRORS.setdefault(page, [])
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: dialog.accept())
    await farm.install(page)
    await page.goto(url)
    return page


async def _no_markup_ran(page: Page) -> None:
    assert await page.evaluate("window.__xss") is None
    assert await page.locator('img[src="x"], body script:not([src])').count() == 0
    assert _ERRORS.pop(page) == [], "the script raised no error"


async def test_the_jobs_page_writes_hostile_text_as_text_and_pages_with_after(
    context: BrowserContext, pages_url: str, shots: Path
) -> None:
    farm = FakeFarm()
    page = await _open(context, pages_url + "/", farm)
    project = page.locator("#jobs tbody tr").nth(1).locator("td.project")
    await project.wait_for()
    assert await project.text_content() == HOSTILE
    await eventually(
        lambda: page.locator("#jobs .progress-cell .progress").count(),
        what="the rows show their progress",
        timeout=WAIT,
    )
    assert await page.locator("#jobs tbody tr").count() == 50
    (query, _, _), *_ = farm.requests("GET", "/api/jobs")
    assert query["limit"] == ["50"] and "after" not in query
    await page.screenshot(path=shots / "jobs.png", full_page=True)
    await page.click("#page-next")
    await eventually(
        lambda: _count_is(page.locator("#jobs tbody tr"), 10),
        what="the second page shows",
        timeout=WAIT,
    )
    assert farm.requests("GET", "/api/jobs")[-1][0]["after"] == ["cursor-2"]
    statuses = [p for m, p, *_ in farm.seen if m == "GET" and p.count("/") == 3]
    assert len(statuses) <= 60, "a status per row shown, never per job of the farm"
    assert await page.locator("#page-next").is_disabled()
    await _no_markup_ran(page)


async def test_the_job_page_draws_4096_tiles_on_a_canvas_and_applies_the_event_deltas(
    context: BrowserContext, pages_url: str, shots: Path
) -> None:
    farm = FakeFarm()
    page = await _open(context, f"{pages_url}/jobs/{JOB_ID}", farm)
    summary = page.locator("#tiles-summary")

    # 1000 done at load, then the SSE `tiles` delta (2000) and `tile-done` (2001)
    await eventually(lambda: summary.text_content(), what="the grid is drawn", timeout=WAIT)
    await eventually(
        lambda: _text_is(summary, "1002 / 4096 done"), what="both SSE events applied", timeout=WAIT
    )
    assert await page.locator("#tiles-panel canvas, canvas").count() == 1
    assert await page.locator("#tiles ~ *").count() < 50, "no DOM node per tile"
    await page.evaluate(
        "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
    )
    for index, colour in ((0, DONE), (2000, DONE), (2001, DONE), (3000, QUEUED), (4095, FAILED)):
        got = await _tile_rgb(page, index)
        assert got == colour, (index, got)

    box = await page.locator("#tiles").bounding_box()
    assert box is not None
    scale = box["width"] / 512
    await page.mouse.move(box["x"] + 508 * scale, box["y"] + 508 * scale)  # tile 4095
    detail = page.locator("#tile-detail")
    await eventually(lambda: _contains(detail, "#4095"), what="hover shows the tile", timeout=WAIT)
    text = await detail.text_content() or ""
    assert HOSTILE in text and "Attempts3" in text and "Takeovers1" in text, text
    assert "Resumes2" in text
    assert await page.locator("#job-error").text_content() == "kernel_failure: " + HOSTILE
    assert await page.locator("#job-facts dd").first.text_content() == HOSTILE
    timeline = page.locator("#timeline tbody td.detail")
    await timeline.first.wait_for()
    assert await timeline.first.text_content() == HOSTILE
    error = page.locator("#timeline tbody td.error-text").first
    assert await error.text_content() == "kernel_failure: " + HOSTILE
    offsets = [q.get("offset") for q, _, _ in farm.requests("GET", f"/api/jobs/{JOB_ID}/tiles")]
    assert offsets == [None, ["3000"]], "the second page of tiles was fetched"
    src = await eventually(
        lambda: page.locator("#preview").get_attribute("src"),
        what="the preview loads",
        timeout=WAIT,
    )
    assert "/preview.png?max_edge=512" in src
    await page.screenshot(path=shots / "job.png", full_page=True)
    await _no_markup_ran(page)

    await page.click("#controls button[data-action=pause]")
    await eventually(
        lambda: farm.requests("POST", f"/api/jobs/{JOB_ID}/pause"), what="paused", timeout=WAIT
    )
    _, headers, body = farm.requests("POST", f"/api/jobs/{JOB_ID}/pause")[0]
    assert headers["x-csrf-token"] == "csrf-123" and body == {}


async def test_the_dead_letter_page_previews_then_requeues_the_selected_letters(
    context: BrowserContext, pages_url: str, shots: Path
) -> None:
    farm = FakeFarm()
    page = await _open(context, pages_url + "/dlq", farm)
    error = page.locator("#dlq tbody td.error-text").first
    await error.wait_for()
    assert await error.text_content() == HOSTILE
    await page.locator("#dlq tbody input[type=checkbox]").first.check()
    await page.click("#dlq-dry-run")
    await eventually(lambda: _contains(page.locator("#dlq-report-title"), "dry run"),
                     what="the dry-run report shows", timeout=WAIT)  # fmt: skip
    ((_, headers, body),) = farm.requests("POST", "/api/dlq/requeue")
    assert body == {"dry_run": True, "seqs": [7]} and headers["x-csrf-token"] == "csrf-123"
    assert await page.locator("#dlq-report-table td").nth(4).text_content() == HOSTILE
    await page.screenshot(path=shots / "dlq-dry-run.png", full_page=True)
    await page.locator("#dlq tbody input[type=checkbox]").first.check()
    await page.click("#dlq-requeue")
    await eventually(lambda: _text_is(page.locator("#dlq-report-title"), "Requeued"),
                     what="the requeue report shows", timeout=WAIT)  # fmt: skip
    assert farm.requests("POST", "/api/dlq/requeue")[-1][2] == {"dry_run": False, "seqs": [7]}
    await _no_markup_ran(page)


async def test_the_workers_page_shows_the_ten_numbers_and_the_workers(
    context: BrowserContext, pages_url: str, shots: Path
) -> None:
    farm = FakeFarm()
    page = await _open(context, pages_url + "/workers", farm)
    node = page.locator("#workers tbody td").first
    await node.wait_for()
    assert await node.text_content() == HOSTILE
    numbers = page.locator("#farm .number")
    assert await numbers.count() == 12  # the ten numbers, latency as three percentiles
    assert await page.locator("#farm [data-key=queue_depth] dd").text_content() == "2995"
    assert await page.locator("#farm [data-key=retry_rate] dd").text_content() == "1.2 %"
    await page.screenshot(path=shots / "workers.png", full_page=True)
    await _no_markup_ran(page)


async def test_a_viewer_gets_disabled_buttons(browser: Browser, pages_url: str) -> None:
    ctx = await browser.new_context(extra_http_headers={"X-Test-Role": "viewer"})
    try:
        page = await _open(ctx, f"{pages_url}/jobs/{JOB_ID}", FakeFarm())
        await eventually(lambda: _contains(page.locator("#job-state"), "progressing"),
                         what="the status shows", timeout=WAIT)  # fmt: skip
        buttons = page.locator("#controls button")
        assert await buttons.count() == 5
        for i in range(5):
            assert await buttons.nth(i).is_disabled()
    finally:
        await ctx.close()


async def _text_is(locator: Any, text: str) -> bool:
    return bool(await locator.text_content() == text)


async def _count_is(locator: Any, count: int) -> bool:
    return bool(await locator.count() == count)


async def _contains(locator: Any, text: str) -> bool:
    return text in (await locator.text_content() or "")


async def _tile_rgb(page: Page, index: int) -> tuple[int, ...] | None:
    """The canvas colour at the centre of tile ``index`` (None before it is drawn)."""
    rgba = await page.evaluate(
        """([index, side, tile]) => {
            const c = document.getElementById('tiles');
            const s = c.width / (side * tile);
            const x = Math.floor(((index % side) * tile + tile / 2) * s);
            const y = Math.floor((Math.floor(index / side) * tile + tile / 2) * s);
            return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data);
        }""",
        [index, 64, 8],
    )
    return tuple(rgba[:3]) if rgba[3] else None


# ---- the whole flow against `tessera up` --------------------------------------------------

VIEWER_TOKEN, OPERATOR_TOKEN = "viewer-tok-0123456789", "operator-tok-0123456789"
#: TESSERA_WEB_TOKEN's form (services.web.auth): ``role:TOKEN`` entries
WEB_TOKEN = f"viewer:{VIEWER_TOKEN},operator:{OPERATOR_TOKEN}"
#: a scene POV-Ray cannot parse: its tile is dead-lettered (renderer_failed), error text and all
BROKEN_POV = (
    "#version 3.7;\ncamera { location <0, 0, -3> look_at 0 }\n"
    "// <script>window.__xss=1</script>\n"
    "sphere { <0, 0, 0>, 1 pigment { color rgb <1, 0, 0> }\n"  # no closing brace
)


@pytest.fixture
def web_up(server_dir: Path) -> Iterator[tuple[Up, str]]:
    port = free_port()
    env = {"TESSERA_WEB_PORT": str(port), "TESSERA_WEB_TOKEN": WEB_TOKEN,
           "TESSERA_CHECKPOINT_INTERVAL": "0.3"}  # fmt: skip
    with running_up(server_dir, env=env) as up:
        up.read_exports()
        base = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            assert up.popen.poll() is None, up.stderr()
            return _http(base + "/api/farm", OPERATOR_TOKEN)[0] == 200

        eventually_sync(answers, timeout=90, interval=0.2, what="the web console answers",
                        detail=up.stderr)  # fmt: skip
        yield up, base
        assert up.interrupt() == 0


def _http(url: str, token: str, data: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {token}"})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _mean_diff(a: bytes, b: bytes) -> float:
    """Mean absolute difference of two PNGs' RGB, each scaled to 0..1."""

    def rgb(data: bytes) -> np.ndarray:
        pixels = read_png(data)
        return pixels[:, :, :3].astype(np.float64) / np.iinfo(pixels.dtype).max

    x, y = rgb(a), rgb(b)
    assert x.shape == y.shape, (x.shape, y.shape)
    return float(np.abs(x - y).mean())


@pytest.mark.timeout(600)
async def test_the_whole_flow_in_the_browser_against_tessera_up(
    web_up: tuple[Up, str], browser: Browser, shots: Path, tmp_path: Path
) -> None:
    up, base = web_up
    ctx = await browser.new_context(
        viewport={"width": 1280, "height": 900},
        extra_http_headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
    )
    try:
        page = await ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("dialog", lambda dialog: dialog.accept())
        await page.goto(base + "/")
        assert await page.get_attribute("body", "data-role") == "operator"

        # A submit the gateway refuses: its message (which quotes the scene) shows as text.
        await page.fill("#submit [name=scene]", "<script>window.__xss=1</script>")
        await page.click("#submit button[type=submit]")
        notice = page.locator("#notice")
        await eventually(lambda: _contains(notice, "<script>window.__xss=1</script>"),
                         timeout=30, what="the refusal shows")  # fmt: skip
        assert await page.evaluate("window.__xss") is None

        # Submit from the page: 4 tiles of 2,000 samples, checkpointed every 0.3 s.
        form = {"project": "web", "scene": "cornell", "width": "32", "height": "32",
                "spp": "2000", "tile_size": "16", "priority": "60"}  # fmt: skip
        for name, value in form.items():
            await page.fill(f"#submit [name={name}]", value)
        await page.click("#submit button[type=submit]")
        await page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]+$"), timeout=30_000)
        job_id = page.url.rsplit("/", 1)[1]
        state = page.locator("#job-state")

        async def preview() -> bytes:
            response = await ctx.request.get(f"{base}/api/jobs/{job_id}/preview.png?max_edge=64")
            assert response.ok, await response.text()
            return await response.body()

        async def checkpointed() -> bytes | None:
            reply = await (await ctx.request.get(f"{base}/api/jobs/{job_id}")).json()
            return await preview() if 0 < reply["samples_done"] < reply["samples_total"] else None

        early = await eventually(checkpointed, timeout=120, interval=0.1,
                                 what="a checkpoint lands")  # fmt: skip
        await page.screenshot(path=shots / "flow-1-converging.png", full_page=True)

        # Pause and resume from the page.
        await page.click("#controls button[data-action=pause]")
        await eventually(lambda: _text_is(state, "paused"), timeout=30, what="paused")
        await page.screenshot(path=shots / "flow-2-paused.png", full_page=True)
        await page.click("#controls button[data-action=resume]")
        await eventually(lambda: _text_is_not(state, "paused"), timeout=30, what="resumed")

        # The grid fills and the job completes; the preview converged on the result.
        await eventually(lambda: _text_is(page.locator("#tiles-summary"), "4 / 4 done"),
                         timeout=240, what="the grid fills")  # fmt: skip
        await eventually(lambda: _text_is(state, "completed"), timeout=120, what="completed")
        versions = int(await page.locator("#preview").get_attribute("data-version") or 0)
        assert versions >= 2, "the preview was refreshed as the job ran"
        result = await ctx.request.get(f"{base}/api/jobs/{job_id}/image.png")
        assert result.ok
        image = await result.body()
        before = _mean_diff(early, image)

        async def sharper() -> tuple[float] | None:
            # a preview asked for within a second of another size's encode may still be the
            # cached one (at most one encode a second per job): ask again
            after = _mean_diff(await preview(), image)
            return (after,) if after < before else None

        (after,) = await eventually(sharper, timeout=10, interval=0.5, what="it sharpened")
        assert after < before / 2, (after, before)
        await page.screenshot(path=shots / "flow-3-completed.png", full_page=True)

        # Cancel another job from its page.
        other = await ctx.request.post(f"{base}/api/jobs", data=json.dumps(
            {"project": "web", "scene": "cornell", "width": 32, "height": 32, "spp": 60000,
             "tile_size": 16}), headers={"Content-Type": "application/json"})  # fmt: skip
        assert other.ok, await other.text()
        other_id = (await other.json())["job_id"]
        await page.goto(f"{base}/jobs/{other_id}")
        await eventually(lambda: _text_is_not(state, "…"), timeout=30, what="status shows")
        await page.click("#controls button[data-action=cancel]")
        await eventually(lambda: _text_is(state, "cancelled"), timeout=30, what="cancelled")

        # A dead letter (a scene POV-Ray cannot parse), requeued from the page.
        pov = tmp_path / "broken.pov"
        pov.write_text(BROKEN_POV)
        submitted = up.cli("submit", str(pov), "--width", "16", "--height", "16", "--tile", "16",
                           "--project", "web")  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        pov_id = submitted.stdout.split()[0]

        async def listed() -> bool:
            await page.goto(f"{base}/dlq?job_id={pov_id}")
            await page.locator("#dlq-empty, #dlq tbody tr").first.wait_for()
            return await page.locator("#dlq tbody tr").count() == 1

        await eventually(listed, timeout=120, interval=0.5, what="the dead letter is listed")
        error = await page.locator("#dlq tbody td.error-text").text_content() or ""
        assert "Parse Error" in error, error
        # Nothing selected: the requeue names the job of the filter (the gateway's
        # dlq.requeue takes a job; a selection sends the contract's `seqs`).
        await page.click("#dlq-dry-run")
        await eventually(lambda: _contains(page.locator("#dlq-report-title"), "dry run"),
                         timeout=30, what="the dry run shows")  # fmt: skip
        await page.screenshot(path=shots / "flow-4-dlq-dry-run.png", full_page=True)
        await page.click("#dlq-requeue")
        await eventually(lambda: _text_is(page.locator("#dlq-report-title"), "Requeued"),
                         timeout=30, what="requeued")  # fmt: skip
        assert await page.locator("#dlq-report-table td").nth(6).text_content() == "yes"

        await page.goto(base + "/workers")
        await page.locator("#workers tbody tr").first.wait_for(timeout=30_000)
        await page.screenshot(path=shots / "flow-5-workers.png", full_page=True)
        assert await page.evaluate("window.__xss") is None
        assert errors == [], errors
    finally:
        await ctx.close()


async def _text_is_not(locator: Any, text: str) -> bool:
    return bool(await locator.text_content() != text)
