"""Replies of the console's JSON API, shaped as the contract says, for browser tests of the pages
alone: Playwright answers the page's ``/api/...`` requests with them (``page.route``), so the
script's drawing, paging, events and escaping are checked in a real Chromium without a farm.
The full flow against ``tessera up`` is in test_browser.py too.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from PIL import Image
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Request, Route

JOB_ID = "0190f3a2-7c1e-7abc-8def-0123456789ab"
#: markup that would run or draw if the page wrote it as HTML
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=1</script>'
SIDE = 64  # tiles per side: 4,096 tiles
TILE = 8


def summary(job_id: str, project: str, state: str = "progressing") -> dict[str, Any]:
    return {
        "job_id": job_id, "project": project, "state": state, "frame": 0,
        "width": SIDE * TILE, "height": SIDE * TILE, "spp": 64, "generation": 0,
        "created_at": "2026-12-01T19:13:35.123456+00:00",
        "updated_at": "2026-12-01T19:14:35.123456+00:00", "finished_at": None,
        "priority": 50, "deadline_at": None, "renderer": "tessera",
    }  # fmt: skip


def status(job_id: str, project: str, error: str | None) -> dict[str, Any]:
    return summary(job_id, project) | {
        "idempotency_key": "k", "input_hash": "0" * 64, "tile_size": TILE,
        "tiles_total": SIDE * SIDE, "tiles_done": 1000,
        "tiles_by_state": {"done": 1000, "progressing": 100, "queued": 2995, "failed_terminal": 1},
        "samples_total": 64 * SIDE * SIDE, "samples_done": 64 * 1000 + 32 * 100,
        "cancel_requested": False, "result_location": None, "result_sha256": None,
        "float_location": None, "last_error_code": "kernel_failure" if error else None,
        "last_error": error, "waiting": None,
    }  # fmt: skip


#: the columns of a job.tiles row (proto.api_replies.TILE_COLUMNS)
COLUMNS = ["index", "x", "y", "w", "h", "state", "samples_done", "spp", "attempts", "takeovers",
           "resumes", "last_error_code", "last_error", "node"]  # fmt: skip
#: job.tiles rows per reply: the 4,096 tiles come in two pages (next_offset)
PAGE = 3000


def tiles(error: str, offset: int) -> dict[str, Any]:
    """A job.tiles reply: compact rows of :data:`COLUMNS` from ``offset``, paged."""
    out = []
    for i in range(SIDE * SIDE):
        state = "done" if i < 1000 else "progressing" if i < 1100 else "queued"
        failed = i == SIDE * SIDE - 1
        if failed:
            state = "failed_terminal"
        out.append({
            "index": i, "x": (i % SIDE) * TILE, "y": (i // SIDE) * TILE, "w": TILE, "h": TILE,
            "state": state, "samples_done": 64 if state == "done" else 32 if i < 1100 else 0,
            "spp": 64, "attempts": 3 if failed else 1, "takeovers": 1,
            "resumes": 2, "last_error_code": "kernel_failure" if failed else None,
            "last_error": error if failed else None,
            "node": "worker-1" if state == "progressing" else None,
        })  # fmt: skip
    rows = [[t[c] for c in COLUMNS] for t in out[offset : offset + PAGE]]
    following = offset + PAGE if offset + PAGE < len(out) else None
    return {"job_id": JOB_ID, "width": SIDE * TILE, "height": SIDE * TILE, "tile_size": TILE,
            "renderer": "tessera", "state": "progressing", "spp": 64, "tiles_total": len(out),
            "columns": COLUMNS, "tiles": rows, "offset": offset,
            "next_offset": following}  # fmt: skip


def png(colour: tuple[int, int, int], size: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def sse(*events: tuple[str, dict[str, Any]]) -> str:
    """An event-stream body; ``retry`` keeps the browser from reconnecting during the test."""
    return "retry: 3600000\n\n" + "".join(
        f"event: {kind}\ndata: {json.dumps(data)}\n\n" for kind, data in events
    )


@dataclass
class FakeFarm:
    """The API's answers; ``text`` is what every user-supplied field carries (the project, the
    errors, the node names) unless ``project``/``error``/``node`` say otherwise."""

    text: str = HOSTILE
    project: str | None = None
    error: str | None = None
    node: str | None = None
    #: every request the page made: (method, path, query, headers, body)
    seen: list[tuple[str, str, dict[str, list[str]], dict[str, str], Any]] = field(
        default_factory=list
    )

    def __post_init__(self) -> None:
        self.project = self.text if self.project is None else self.project
        self.error = self.text if self.error is None else self.error
        self.node = self.text if self.node is None else self.node

    async def install(self, page: Page) -> None:
        await page.route("**/api/**", self.answer)

    def requests(
        self, method: str, path: str
    ) -> list[tuple[dict[str, list[str]], dict[str, str], Any]]:
        return [(q, h, b) for m, p, q, h, b in self.seen if (m, p) == (method, path)]

    async def answer(self, route: Route, request: Request) -> None:
        try:
            await self._answer(route, request)
        except PlaywrightError:
            if not request.frame.page.is_closed():
                raise  # else: a request still in flight when its page closed

    async def _answer(self, route: Route, request: Request) -> None:
        url = urlsplit(request.url)
        query = parse_qs(url.query)
        body = request.post_data_json if request.method == "POST" else None
        self.seen.append((request.method, url.path, query, await request.all_headers(), body))
        reply = self.reply(request.method, url.path, query, body)
        if isinstance(reply, bytes):
            await route.fulfill(body=reply, content_type="image/png")
        elif isinstance(reply, str):
            await route.fulfill(body=reply, content_type="text/event-stream")
        elif reply is None:
            await route.fulfill(status=404, json={"error": {"code": "not_found", "message": "no"}})
        else:
            await route.fulfill(json=reply)

    def reply(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:  # noqa: C901
        job = f"/api/jobs/{JOB_ID}"
        if path == "/api/jobs" and method == "GET":
            second = query.get("after") == ["cursor-2"]
            ids = range(50, 60) if second else range(50)
            jobs = [summary(f"0190f3a2-7c1e-7abc-8def-{i:012d}",
                            str(self.project) if i == 1 else f"p{i}") for i in ids]  # fmt: skip
            return {"jobs": jobs, "next_cursor": None if second else "cursor-2"}
        if path.startswith("/api/jobs/") and path.endswith("/preview.png"):
            return png((200, 120, 40))
        if path.endswith("/events"):
            return sse(
                ("tiles", {"job_id": JOB_ID, "full": False,
                           "tiles": [{"index": 2000, "state": "done", "samples_done": 64}]}),
                ("tile-done", {"job_id": JOB_ID, "tile_index": 2001, "attempt_id": "a",
                               "result_key": "r", "input_hash": "h"}),
            )  # fmt: skip
        if path == job + "/tiles":
            return tiles(str(self.error), int(query.get("offset", ["0"])[0]))
        if path == job + "/timeline":
            events = [{"id": 100 - i, "at": "2026-12-01T19:14:35+00:00", "kind": "fail",
                       "entity": "tile", "tile_index": i, "attempt_id": "a", "node": "worker-1",
                       "from_state": "progressing", "to_state": "failed_retryable",
                       "detail": self.error, "error_code": "kernel_failure", "error": self.error}
                      for i in range(5)]  # fmt: skip
            return {"job_id": JOB_ID, "events": events, "next_before_id": None}
        if path.startswith("/api/jobs/") and path.count("/") == 3 and method == "GET":
            return status(path.rsplit("/", 1)[1], str(self.project), self.error)
        if path.startswith(job + "/") and method == "POST":
            return {"job_id": JOB_ID, "state": "paused"}
        if path == "/api/dlq":
            letters = [{"seq": s, "subject": f"tessera.dlq.{JOB_ID}.tile-{s}",
                        "time": "2026-12-01T19:14:35+00:00", "malformed": None, "job_id": JOB_ID,
                        "unit": f"tile-{s}", "reason": "renderer_failed", "error": self.error,
                        "source_stream": "TILES", "source_seq": s, "deliveries": 1,
                        "original_subject": "tessera.tiles.tessera.x.0"}
                       for s in (7, 8)]  # fmt: skip
            return {"dead_letters": letters, "next_cursor": None}
        if path == "/api/dlq/requeue":
            views = [{"seq": s, "job_id": JOB_ID, "unit": f"tile-{s}", "reason": "renderer_failed",
                      "error": self.error, "action": "requeue", "why": self.error, "tile": s,
                      "generation": 1, "done": not body["dry_run"]}
                     for s in body.get("seqs", [])]  # fmt: skip
            return {"dry_run": body["dry_run"], "requeued": len(views), "skipped": 0,
                    "examined": len(views), "dead_letters": views, "omitted": 0}  # fmt: skip
        if path == "/api/farm":
            return {"queue_depth": 2995, "oldest_age_s": 12.5, "in_flight": 100,
                    "retry_rate": 0.012, "duplicates_suppressed": 3, "lease_renewal_failures": 0,
                    "resume_rate": 0.05, "latency_p50_s": 0.8, "latency_p95_s": 2.1,
                    "latency_p99_s": 3.4, "dlq_size": 2, "finalization_failures": 0,
                    "window_s": 300, "at": "2026-12-01T19:14:35+00:00"}  # fmt: skip
        if path == "/api/workers":
            return {"workers": [{"node": self.node, "threads": 2, "in_hand": 2,
                                 "renderers": {"tessera": "1", "povray": "3.7.0.10"},
                                 "version": "0.1.0", "started_at": "2026-12-01T19:00:00+00:00",
                                 "current_tiles": [[JOB_ID, 1000]]}]}  # fmt: skip
        return None
