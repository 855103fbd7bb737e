"""Web console benchmark (issue 18; not a test): SSE latency and status requests per second.

Run: ``python -m bench.web``. Starts ``tessera up`` (its web console on a free port, a generated
operator token) and measures, against it:

- SSE latency, publish -> browser handler: a ``job-resumed`` event for a paused job is published
  on its EVENTS subject (as the gateway does), and every open page of that job (headless
  Chromium, ``/jobs/{id}``, its ``EventSource`` on ``/api/jobs/{id}/events``) notes when
  console.js's handler ran (``window.__tesseraSeen``, read only when a harness sets it). The two
  clocks are the same machine's wall clock (ms resolution). With 1 and with 20 open pages;
  p50/p95 over all (page, event) pairs. Target: p95 <= 500 ms.
- Status requests/s: ``GET /api/jobs/{id}`` over HTTP with a bearer token, ``--concurrency``
  requests in flight for ``--seconds`` (one aiohttp client; every reply must be 200).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from playwright.async_api import Browser, Page

from proto import names as n
from proto.messages import JobEvent
from shared.core.config import Settings
from shared.devstack.procs import free_port
from shared.nats.jetstream import connect_nats, publish
from tests.web.browser import chromium

__all__ = ["Console", "measure_sse", "measure_status", "running_console"]

_TIMEOUT = 60.0
#: recorded by console.js's SSE dispatcher when a harness sets it to an array
_HOOK = "window.__tesseraSeen = [];"


@dataclass
class Console:
    """A running ``tessera up`` with its web console."""

    base: str
    token: str
    env: dict[str, str]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@contextmanager
def running_console(data_dir: Path) -> Iterator[Console]:
    """``tessera up`` on ``data_dir``, its console answering; Ctrl-C'd (and waited) afterwards."""
    port, viewer, operator = free_port(), secrets.token_hex(16), secrets.token_hex(16)
    env = os.environ | {
        "TESSERA_WEB_PORT": str(port),
        "TESSERA_WEB_TOKEN": f"viewer:{viewer},operator:{operator}",
    }
    argv = [sys.executable, "-m", "services.cli", "up", "--data-dir", str(data_dir)]
    err = (data_dir.parent / f"{data_dir.name}.up-stderr").open("w")
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        assert up.stdout is not None
        exports: dict[str, str] = {}
        for _ in range(3):
            line = up.stdout.readline()
            if not line.startswith("export "):
                raise RuntimeError(f"tessera up did not start: {line!r}")
            name, _, value = shlex.split(line)[1].partition("=")
            exports[name] = value
        console = Console(f"http://127.0.0.1:{port}", operator, exports)
        asyncio.run(_answers(console, up))
        yield console
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        if up.stdout is not None:
            up.stdout.close()
        err.close()


async def _answers(console: Console, up: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    async with aiohttp.ClientSession(headers=console.headers()) as http:
        while True:
            if up.poll() is not None:
                raise RuntimeError("tessera up exited before its web console answered")
            try:
                async with http.get(console.base + "/api/farm") as reply:
                    if reply.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the web console did not answer within 90 s")
            await asyncio.sleep(0.2)


async def _paused_job(http: aiohttp.ClientSession, console: Console) -> str:
    body = {"project": "bench", "scene": "cornell", "width": 32, "height": 32, "spp": 60000,
            "tile_size": 16, "idempotency_key": f"bench-web-{uuid.uuid4().hex}"}  # fmt: skip
    async with http.post(console.base + "/api/jobs", json=body) as reply:
        reply.raise_for_status()
        job_id = str((await reply.json())["job_id"])
    deadline = time.monotonic() + _TIMEOUT
    while True:  # a job is paused once planned (409 before)
        async with http.post(f"{console.base}/api/jobs/{job_id}/pause", json={}) as reply:
            if reply.status == 200:
                return job_id
            if reply.status != 409 or time.monotonic() > deadline:
                raise RuntimeError(f"pause: {reply.status} {await reply.text()}")
        await asyncio.sleep(0.1)


async def _open_pages(browser: Browser, console: Console, job_id: str, count: int) -> list[Page]:
    """``count`` pages of the job, each in its own browser context (as ``count`` users): one
    browser profile holds at most 6 HTTP/1.1 connections to an origin, and every page's event
    stream keeps one open."""
    pages = []
    for _ in range(count):
        ctx = await browser.new_context(extra_http_headers=console.headers())
        await ctx.add_init_script(_HOOK)
        page = await ctx.new_page()
        await page.goto(f"{console.base}/jobs/{job_id}")
        deadline = time.monotonic() + _TIMEOUT
        # (page.evaluate, not wait_for_function: the page's CSP forbids the eval the latter uses)
        while await page.evaluate("document.getElementById('live').textContent") != "live":
            if time.monotonic() > deadline:
                raise RuntimeError("a page's event stream did not open within 60 s")
            await asyncio.sleep(0.05)
        pages.append(page)
    return pages


async def _seen(page: Page, marker: str) -> float | None:
    at = await page.evaluate(
        "(m) => { const e = (window.__tesseraSeen || []).find(s => s.data.detail === m);"
        " return e ? e.at : null; }",
        marker,
    )
    return None if at is None else float(at) / 1000.0


async def measure_sse(console: Console, pages: int, events: int) -> list[float]:
    """Seconds from each publish to each open page's handler (``pages * events`` values)."""
    settings = Settings.from_env(os.environ | console.env)
    nc = await connect_nats(settings, name="bench-web")
    names = n.Names(settings.deployment.namespace)
    try:
        async with (
            aiohttp.ClientSession(headers=console.headers()) as http,
            chromium() as browser,
        ):
            job_id = await _paused_job(http, console)
            opened = await _open_pages(browser, console, job_id, pages)
            out: list[float] = []
            for i in range(events):
                marker = f"bench-{uuid.uuid4().hex[:8]}-{i}"
                event = JobEvent(job_id, n.EventKind.JOB_RESUMED, generation=0, detail=marker)
                sent = time.time()
                await publish(nc.jetstream(), names.event_subject(job_id, event.kind), event,
                              msg_id=f"bench-web-{marker}")  # fmt: skip
                for page in opened:
                    deadline = time.monotonic() + _TIMEOUT
                    while (at := await _seen(page, marker)) is None:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"event {marker} did not reach a page in 60 s")
                        await asyncio.sleep(0.01)
                    out.append(at - sent)
            async with http.post(f"{console.base}/api/jobs/{job_id}/cancel", json={}):
                pass
            return out
    finally:
        await nc.close()


async def measure_status(console: Console, seconds: float, concurrency: int) -> tuple[int, float]:
    """(status replies, requests per second) for ``GET /api/jobs/{id}``."""
    async with aiohttp.ClientSession(
        headers=console.headers(), connector=aiohttp.TCPConnector(limit=concurrency)
    ) as http:
        job_id = await _paused_job(http, console)
        url = f"{console.base}/api/jobs/{job_id}"
        done = 0
        stop = time.monotonic() + seconds

        async def client() -> None:
            nonlocal done
            while time.monotonic() < stop:
                async with http.get(url) as reply:
                    if reply.status != 200:
                        raise RuntimeError(f"status replied {reply.status}: {await reply.text()}")
                    await reply.read()
                    done += 1

        began = time.monotonic()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.monotonic() - began
        async with http.post(f"{url}/cancel", json={}):
            pass
        return done, done / elapsed


def report_sse(pages: int, latencies: list[float]) -> str:
    ms = sorted(v * 1000 for v in latencies)
    p50, p95 = statistics.median(ms), _pct(ms, 95)
    verdict = "met" if p95 <= 500 else "MISSED"
    return (f"SSE publish -> browser handler, {pages} open page(s), {len(ms)} deliveries: "
            f"p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {ms[-1]:.1f} ms "
            f"(target p95 <= 500 ms: {verdict})")  # fmt: skip


def _pct(sorted_ms: list[float], q: int) -> float:
    index = min(len(sorted_ms) - 1, max(0, round(q / 100 * len(sorted_ms)) - 1))
    return sorted_ms[index]


def main() -> None:
    """Start ``tessera up``, measure, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50, help="events published per round")
    parser.add_argument("--seconds", type=float, default=10.0, help="status load duration")
    parser.add_argument("--concurrency", type=int, default=16, help="status requests in flight")
    args = parser.parse_args()
    lines: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="tessera-bench-web-") as tmp,
        running_console(Path(tmp) / "up") as console,
    ):
        for pages in (1, 20):
            latencies = asyncio.run(measure_sse(console, pages, args.events))
            lines.append(report_sse(pages, latencies))
        count, rate = asyncio.run(measure_status(console, args.seconds, args.concurrency))
        lines.append(
            f"status over HTTP: {count} requests in {args.seconds:g} s, {args.concurrency} in "
            f"flight: {rate:.0f} requests/s ({os.cpu_count()} cores, the whole stack on them)"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
