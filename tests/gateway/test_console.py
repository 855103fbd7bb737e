"""The console's data verbs against a real gateway, PostgreSQL, NATS and object store.

Attempts, takeovers, resumes, failures and commits are written through the real store, as the
workers write them; checkpoints through the real progress bucket and object store; live workers
through the real presence bucket.
"""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import asyncpg
import numpy as np
import orjson
import pytest
from nats.aio.client import Client as NATS
from PIL import Image

import kernel.image
from proto.api import SubmitRequest
from proto.api_replies import TILE_COLUMNS
from proto.limits import MAX_REPLY_BYTES
from proto.names import BUCKET_WORKERS, ApiVerb, Names, progress_key
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from services.gateway.preview import MISSING_GREY
from shared.core.lifecycle import TileTrigger
from shared.core.tiles import plan_rects, to_npy
from shared.metadata import TileCommit
from shared.nats.leases import ProgressPointer
from shared.nats.presence import LiveWorkers, WorkerInfo
from shared.objectstore import checkpoint_key, sha256_hex, tile_result_key
from shared.service.runtime import Runtime
from tests.gateway.conftest import body, raw_request

UNKNOWN = "01a2b3c4-0000-7000-8000-000000000000"


async def _planned(rt: Runtime, client: TesseraClient, **overrides: Any) -> tuple[str, int]:
    """A submitted job with its tiles planned (as the scheduler plans them); its id and count."""
    job_id: str = (await client.submit(SubmitRequest(**body(**overrides))))["job_id"]
    job = await rt.db.get_job(job_id)
    assert job is not None
    rects = plan_rects(job.width, job.height, job.tile_size)
    await rt.db.plan_tiles(job_id, rects)
    return job_id, len(rects)


async def _lease(
    rt: Runtime, job_id: str, i: int, token: int, attempt: str, node: str, resumed: int = 0
) -> None:
    ok = await rt.db.fence_tile(job_id, i, token=token, attempt_id=attempt, node=node,
                                resumed_from=resumed)  # fmt: skip
    assert ok


async def _commit(
    rt: Runtime, job_id: str, i: int, token: int, attempt: str, acc: Any, *, inline: bool = False
) -> None:
    """Commit ``acc`` as the tile's result: an object, or (``inline``) in the database."""
    data = to_npy(acc)
    key = None if inline else tile_result_key(job_id, i, sha256_hex(data))
    if key is not None:
        await rt.store.put(key, data)
    done = TileCommit(job_id, i, token=token, attempt_id=attempt, result_key=key,
                      result_sha256=sha256_hex(data), samples_done=4, node="n",
                      result_data=data if inline else None)  # fmt: skip
    await rt.db.commit_tile(done)


async def _fail(rt: Runtime, job_id: str, i: int, token: int, attempt: str, error: str) -> None:
    await rt.db.fail_tile(job_id, i, token=token, attempt_id=attempt,
                          trigger=TileTrigger.RETRYABLE_FAILURE, error_code="store_unavailable",
                          error=error, node="node-a", outcome="retryable")  # fmt: skip


def _flat(value: float, h: int = 16, w: int = 16, samples: int = 4) -> Any:
    """An accumulator of ``samples`` samples whose mean radiance is ``value`` everywhere."""
    return np.full((h, w, 3), value * samples, dtype=np.float64)


# --- job.tiles --------------------------------------------------------------------------------


async def test_tiles_count_attempts_takeovers_resumes_and_name_the_holder(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id, total = await _planned(runtime, client)
    # tile 0: node-a stops renewing; node-b takes it over from a 2-sample checkpoint, commits
    await _lease(runtime, job_id, 0, 1, "a1", "node-a")
    await _lease(runtime, job_id, 0, 2, "a2", "node-b", resumed=2)
    await _commit(runtime, job_id, 0, 2, "a2", _flat(0.5))
    # tile 1: fails retryably on node-a, then node-c holds it
    await _lease(runtime, job_id, 1, 3, "a3", "node-a")
    await _fail(runtime, job_id, 1, 3, "a3", "the store went away <b>")
    await _lease(runtime, job_id, 1, 4, "a4", "node-c")
    reply = await client.job_tiles(job_id)
    assert reply["columns"] == list(TILE_COLUMNS) and reply["next_offset"] is None
    assert (reply["tiles_total"], len(reply["tiles"]), reply["offset"]) == (total, total, 0)
    assert (reply["width"], reply["height"], reply["tile_size"], reply["spp"]) == (64, 48, 16, 4)
    rows = await client.all_tiles(job_id)
    assert [r["index"] for r in rows] == list(range(total))
    assert rows[0] | {"last_error": None, "last_error_code": None} == {
        "index": 0, "x": 0, "y": 0, "w": 16, "h": 16, "state": "done", "samples_done": 4,
        "spp": 4, "attempts": 2, "takeovers": 1, "resumes": 1, "last_error_code": None,
        "last_error": None, "node": None,
    }  # fmt: skip
    one = rows[1]
    assert (one["x"], one["state"], one["attempts"], one["takeovers"]) == (16, "leased", 2, 0)
    assert (one["last_error_code"], one["node"]) == ("store_unavailable", "node-c")
    assert one["last_error"] == "the store went away <b>"
    assert all(r["attempts"] == 0 and r["node"] is None for r in rows[2:])
    last = rows[-1]
    assert (last["x"], last["y"], last["w"], last["h"]) == (48, 32, 16, 16)


async def test_a_4096_tile_job_fits_in_one_reply_within_the_reply_limit(
    gateway: Gateway, runtime: Runtime, client: TesseraClient, nc: NATS, names: Names,
    database_url: str,
) -> None:  # fmt: skip
    job_id, total = await _planned(runtime, client, width=4096, height=4096, tile_size=64, spp=64)
    assert total == 4096
    conn = await asyncpg.connect(database_url)
    try:  # every tile far along, with an error code and a short error: a busy, flaky farm
        await conn.execute(
            "UPDATE tiles SET state = 'progressing', samples_done = 48, attempt_count = 3,"
            " last_error_code = 'store_unavailable', last_error = 'store timed out'"
            " WHERE job_id = $1",
            job_id,
        )
    finally:
        await conn.close()
    msg = await nc.request(names.api_subject(ApiVerb.JOB_TILES),
                           orjson.dumps({"job_id": job_id}), timeout=20)  # fmt: skip
    reply = orjson.loads(msg.data)
    assert reply["ok"] and reply["next_offset"] is None and len(reply["tiles"]) == 4096
    print(f"\njob.tiles reply of a 4,096-tile job: {len(msg.data)} bytes "
          f"({len(msg.data) / 4096:.0f} per tile; limit {MAX_REPLY_BYTES})")  # fmt: skip
    assert len(msg.data) <= MAX_REPLY_BYTES


async def test_tiles_page_by_offset_when_the_rows_do_not_fit(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id, total = await _planned(runtime, client)
    for i in range(total):
        await _lease(runtime, job_id, i, i + 1, f"a{i}", "node-a")
        await _fail(runtime, job_id, i, i + 1, f"a{i}", "x" * 500)
    gateway.console.budget = 1000  # about three rows of 200-character errors
    first = await client.job_tiles(job_id)
    assert 0 < len(first["tiles"]) < total and first["next_offset"] == len(first["tiles"])
    assert all(len(row[12]) == 200 for row in first["tiles"]), "errors cut to 200 characters"
    rows = await client.all_tiles(job_id)
    assert [r["index"] for r in rows] == list(range(total))


# --- job.timeline ------------------------------------------------------------------------------


async def test_the_timeline_pages_newest_first_through_the_whole_audit_trail(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id, _ = await _planned(runtime, client)
    await _lease(runtime, job_id, 3, 1, "a1", "node-a")
    await _fail(runtime, job_id, 3, 1, "a1", "boom")
    trail = await runtime.db.job_events(job_id)
    assert len(trail) >= 5  # created, planned, running, the lease, the failure
    seen: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        page = await client.job_timeline(job_id, limit=2, before_id=before)
        assert len(page["events"]) <= 2
        seen += page["events"]
        before = page["next_before_id"]
        if before is None:
            break
        assert before == page["events"][-1]["id"]
    assert [e["id"] for e in seen] == [e.id for e in reversed(trail)]
    failure = next(e for e in seen if e["error_code"] == "store_unavailable")
    assert (failure["kind"], failure["tile_index"], failure["attempt_id"]) == (
        "retryable_failure",
        3,
        "a1",
    )
    assert (failure["entity"], failure["to_state"], failure["error"]) == (
        "tile",
        "failed_retryable",
        "boom",
    )
    whole = await client.job_timeline(job_id)
    assert len(whole["events"]) == len(trail) and whole["next_before_id"] is None


# --- job.preview -------------------------------------------------------------------------------


def _pixels(reply: dict[str, Any]) -> Any:
    assert reply["content_type"] == "image/png"
    image = Image.open(io.BytesIO(base64.b64decode(reply["data_b64"])))
    assert image.size == (reply["width"], reply["height"])
    return np.asarray(image.convert("RGB"))


async def test_the_preview_shows_committed_tiles_checkpoints_and_grey_and_is_cached(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id, total = await _planned(runtime, client)
    await _lease(runtime, job_id, 0, 1, "a1", "node-a")
    await _commit(runtime, job_id, 0, 1, "a1", _flat(0.25))
    # tile 5 (x 16..32, y 16..32) has a 2-sample checkpoint, named by its progress pointer
    await _lease(runtime, job_id, 5, 2, "a2", "node-a")
    key = checkpoint_key(job_id, 5, "a2", 2)
    await runtime.store.put(key, to_npy(_flat(0.75, samples=2)))
    pointer = ProgressPointer("h", 2, key, "a2")
    await runtime.progress.put(progress_key(job_id, 5), pointer, last=None)
    assert await runtime.db.record_progress(job_id, 5, token=2, samples_done=2)
    previews = gateway.console.previews
    now = [1000.0]
    previews.clock = lambda: now[0]

    first = await client.job_preview(job_id, max_edge=64)
    assert (first["width"], first["height"], first["max_edge"]) == (64, 48, 64)
    assert (first["tiles_done"], first["tiles_total"]) == (1, total)
    assert (first["samples_done"], first["samples_total"]) == (6, 4 * total)
    px = _pixels(first)
    assert (px[0:16, 0:16] == kernel.image.tonemap(_flat(0.25), 4)).all()
    assert (px[16:32, 16:32] == kernel.image.tonemap(_flat(0.75, samples=2), 2)).all()
    assert (px[0:16, 16:64] == MISSING_GREY).all() and (px[32:48] == MISSING_GREY).all()
    assert previews.encodes == 1

    again = await client.job_preview(job_id, max_edge=64)
    assert again["version"] == first["version"] and again["data_b64"] == first["data_b64"]
    await _lease(runtime, job_id, 1, 3, "a3", "node-a")
    await _commit(runtime, job_id, 1, 3, "a3", _flat(1.0), inline=True)  # a small result
    within = await client.job_preview(job_id, max_edge=64)  # changed, but within the second
    assert within["version"] == first["version"] and previews.encodes == 1
    now[0] += 1.0
    later = await client.job_preview(job_id, max_edge=64)
    assert later["version"] != first["version"] and later["tiles_done"] == 2
    assert (_pixels(later)[0:16, 16:32] == 255).all() and previews.encodes == 2
    now[0] += 5.0
    same = await client.job_preview(job_id, max_edge=64)  # nothing changed: not encoded
    assert same["version"] == later["version"] and previews.encodes == 2

    small = await client.job_preview(job_id, max_edge=16)  # another size: its own canvas
    assert (small["width"], small["height"], small["max_edge"]) == (16, 12, 16)
    assert (_pixels(small)[0:4, 0:4] == kernel.image.tonemap(_flat(0.25), 4)[0, 0]).all()
    assert previews.encodes == 3


async def test_a_preview_too_large_for_one_reply_is_encoded_smaller(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id, total = await _planned(runtime, client)
    rng = np.random.default_rng(3)
    for i in range(total):  # noise compresses badly: 64x48 of it is about 9 KB of PNG
        await _lease(runtime, job_id, i, i + 1, f"a{i}", "node-a")
        await _commit(runtime, job_id, i, i + 1, f"a{i}", rng.uniform(0, 4, (16, 16, 3)))
    gateway.console.previews.budget = 3000
    reply = await client.job_preview(job_id, max_edge=64)
    assert len(reply["data_b64"]) <= 3000 and reply["tiles_done"] == total
    assert reply["width"] < 64 and reply["height"] < 48 and reply["max_edge"] == 64
    assert _pixels(reply).shape == (reply["height"], reply["width"], 3)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"max_edge": 15}, "invalid"),
        ({"max_edge": 2049}, "invalid"),
        ({"max_edge": "big"}, "bad_request"),
        ({"max_edge": 64, "colour": "red"}, "bad_request"),
        ({"job_id": "no/slash"}, "invalid"),
        ({"job_id": UNKNOWN}, "not_found"),
    ],
)
async def test_preview_requests_are_validated(
    gateway: Gateway, runtime: Runtime, client: TesseraClient, nc: NATS, names: Names,
    fields: dict[str, Any], code: str,
) -> None:  # fmt: skip
    job_id, _ = await _planned(runtime, client)
    request = {"job_id": job_id} | fields
    reply = await raw_request(nc, names, ApiVerb.JOB_PREVIEW, orjson.dumps(request))
    assert reply["ok"] is False and reply["error"]["code"] == code, reply


@pytest.mark.parametrize(
    ("verb", "request_", "code"),
    [
        (ApiVerb.JOB_TILES, {"job_id": UNKNOWN}, "not_found"),
        (ApiVerb.JOB_TILES, {"job_id": UNKNOWN, "offset": -1}, "invalid"),
        (ApiVerb.JOB_TILES, {"job_id": UNKNOWN, "offset": 16384}, "invalid"),
        (ApiVerb.JOB_TIMELINE, {"job_id": UNKNOWN}, "not_found"),
        (ApiVerb.JOB_TIMELINE, {"job_id": UNKNOWN, "limit": 0}, "invalid"),
        (ApiVerb.JOB_TIMELINE, {"job_id": UNKNOWN, "limit": 1001}, "invalid"),
        (ApiVerb.JOB_TIMELINE, {"job_id": UNKNOWN, "before_id": 0}, "invalid"),
        (ApiVerb.JOB_TIMELINE, {"job_id": UNKNOWN, "before_id": "x"}, "bad_request"),
        (ApiVerb.JOB_TIMELINE, {}, "bad_request"),
        (ApiVerb.WORKERS, {"renderer": "No Such"}, "invalid"),
        (ApiVerb.WORKERS, {"node": "x"}, "bad_request"),
        (ApiVerb.FARM, {"window": 9}, "invalid"),
        (ApiVerb.FARM, {"window": 86401}, "invalid"),
        (ApiVerb.FARM, {"window": True}, "bad_request"),
    ],
)
async def test_console_requests_are_validated(
    gateway: Gateway, nc: NATS, names: Names, verb: ApiVerb, request_: dict[str, Any], code: str
) -> None:
    reply = await raw_request(nc, names, verb, orjson.dumps(request_))
    assert reply["ok"] is False and reply["error"]["code"] == code, reply


# --- workers and farm --------------------------------------------------------------------------


async def test_workers_lists_the_live_workers_of_the_presence_bucket(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    live = LiveWorkers(runtime.js, runtime.names.bucket(BUCKET_WORKERS))
    started = time.time() - 30
    current: list[list[Any]] = [["job-a", 3], ["job-b", 0]]
    info = WorkerInfo(node="render-7", threads=6, in_hand=2, renderers={"tessera": "k1"},
                      version="0.9", started_at=started, current=current)  # fmt: skip
    await live.put(info)
    await live.put(WorkerInfo("blend-1", 4, 0, {"blender": "4.2"}, "0.9", started))
    reply = await client.workers()
    assert [w["node"] for w in reply["workers"]] == ["blend-1", "render-7"]
    assert reply["threads"] == 10
    worker = reply["workers"][1]
    assert (worker["threads"], worker["in_hand"], worker["renderers"]) == (6, 2, {"tessera": "k1"})
    assert worker["current_tiles"] == [["job-a", 3], ["job-b", 0]] and worker["version"] == "0.9"
    assert worker["uptime_s"] >= 30 and worker["started_at"].endswith("+00:00")
    only = await client.workers(renderer="blender")
    assert [w["node"] for w in only["workers"]] == ["blend-1"] and only["threads"] == 4
    await live.remove("blend-1")
    assert [w["node"] for w in (await client.workers())["workers"]] == ["render-7"]


async def test_farm_numbers_come_from_the_streams_and_the_audit_window(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id, _ = await _planned(runtime, client)
    await _lease(runtime, job_id, 0, 1, "a1", "node-a")
    await _commit(runtime, job_id, 0, 1, "a1", _flat(0.5))  # done
    await _lease(runtime, job_id, 1, 2, "a2", "node-a", resumed=2)
    await _commit(runtime, job_id, 1, 2, "a2", _flat(0.5))  # done, resumed
    await _lease(runtime, job_id, 2, 3, "a3", "node-a")
    await _fail(runtime, job_id, 2, 3, "a3", "boom")  # retryable
    await _lease(runtime, job_id, 3, 4, "a4", "node-a")
    await runtime.db.end_attempt("a4", outcome="lease_lost")
    await _lease(runtime, job_id, 4, 5, "a5", "node-a")
    refused = TileCommit(job_id, 4, token=99, attempt_id="a5", result_key="k",
                         result_sha256="ab" * 32, samples_done=4, node="n")  # fmt: skip
    await runtime.db.commit_tile(refused)  # a stale owner's commit: fenced
    await runtime.db.start_final_attempt(job_id, attempt_id="f1", node="fin", fence=1)
    await runtime.db.end_attempt("f1", outcome="retryable", error_code="x", error="y")
    await runtime.js.publish(runtime.names.dlq_subject(job_id, "job"), b"a dead letter")
    reply = await client.farm(window=60)
    assert reply["window_s"] == 60 and reply["at"].endswith("+00:00")
    assert reply["retry_rate"] == pytest.approx(1 / 5)  # 5 tile attempts ended, 1 retryable
    assert reply["resume_rate"] == pytest.approx(1 / 5)
    assert reply["duplicates_suppressed"] == 1 and reply["lease_renewal_failures"] == 1
    assert reply["finalization_failures"] == 1 and reply["dlq_size"] == 1
    p50, p95, p99 = reply["latency_p50_s"], reply["latency_p95_s"], reply["latency_p99_s"]
    assert p50 is not None and 0 <= p50 <= p95 <= p99
    # no dispatcher runs here: the 7 tiles never leased are queued and unreleased
    assert reply["queue_depth"] == 7
    assert reply["in_flight"] == 0 and reply["oldest_age_s"] >= 0


async def test_farm_with_nothing_to_count(gateway: Gateway, client: TesseraClient) -> None:
    reply = await client.farm()
    assert reply["window_s"] == 300
    assert (reply["retry_rate"], reply["resume_rate"], reply["queue_depth"]) == (0.0, 0.0, 0)
    assert (reply["latency_p50_s"], reply["latency_p95_s"], reply["latency_p99_s"]) == (
        None,
        None,
        None,
    )
