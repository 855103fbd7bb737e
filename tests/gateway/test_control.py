"""priority, pause, resume, project set/list/show and submit's priority and deadline, through a
real gateway: the replies, the audit rows, and bad input refused with nothing written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest
from nats.aio.client import Client as NATS

from proto.api import SubmitRequest
from proto.names import STREAM_EVENTS, ApiVerb, EventKind, Names, new_job_id
from proto.replies import ApiError
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from shared.core.lifecycle import JobTrigger, TileState, TileTrigger
from shared.service.runtime import Runtime
from tests.gateway.conftest import body
from tests.gateway.results import completed_job


async def _submit(client: TesseraClient, **overrides: object) -> str:
    reply = await client.submit(SubmitRequest(**body(**overrides)))
    job_id: str = reply["job_id"]
    return job_id


async def _raw(nc: NATS, names: Names, verb: ApiVerb, request: dict[str, Any]) -> dict[str, Any]:
    msg = await nc.request(names.api_subject(verb), orjson.dumps(request), timeout=10)
    reply: dict[str, Any] = orjson.loads(msg.data)
    return reply


async def _project_rows(rt: Runtime) -> tuple[list[Any], list[Any]]:
    conn = await asyncpg.connect(rt.settings.database_url)
    try:
        rows = await conn.fetch("SELECT * FROM projects ORDER BY name")
        events = await conn.fetch("SELECT * FROM project_events ORDER BY id")
    finally:
        await conn.close()
    return list(rows), list(events)


async def test_submit_stores_priority_and_deadline_and_status_lists_them(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    deadline = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    job_id = await _submit(client, priority=90, deadline=deadline.isoformat())
    job = await runtime.db.get_job(job_id)
    assert job is not None and job.priority == 90 and job.deadline_at == deadline
    status = await client.status(job_id)
    assert status["priority"] == 90
    assert datetime.fromisoformat(status["deadline_at"]) == deadline
    listed = (await client.list())["jobs"][0]
    assert listed["job_id"] == job_id and listed["priority"] == 90
    # a repeat with another priority or deadline is the same job, unchanged (not a conflict)
    again = await client.submit(SubmitRequest(**body(priority=10)))
    assert again["job_id"] == job_id and again["duplicate"] is True
    assert (await client.status(job_id))["priority"] == 90


@pytest.mark.parametrize(
    ("deadline", "why"),
    [("2001-01-01T00:00:00Z", "in the past"), ("tomorrow", "not an ISO 8601"),
     ("2099-01-01T00:00:00", "no UTC offset")],
)  # fmt: skip
async def test_a_bad_deadline_is_invalid_and_creates_no_job(
    gateway: Gateway, runtime: Runtime, nc: NATS, names: Names, deadline: str, why: str
) -> None:
    reply = await _raw(nc, names, ApiVerb.SUBMIT, body(deadline=deadline))
    assert reply["ok"] is False and reply["error"]["code"] == "invalid"
    assert why in reply["error"]["message"]
    assert await runtime.db.list_jobs() == []


async def test_priority_changes_and_is_audited_bad_values_write_nothing(
    gateway: Gateway, runtime: Runtime, client: TesseraClient, nc: NATS, names: Names
) -> None:
    job_id = await _submit(client)
    reply = await client.set_priority(job_id, 80)
    assert reply == {"job_id": job_id, "state": "queued", "priority": 80}
    trail = [e for e in await runtime.db.job_events(job_id) if e.trigger == "priority"]
    assert len(trail) == 1 and trail[0].detail == "priority 50 -> 80"
    for bad in (101, -1):
        refused = await _raw(nc, names, ApiVerb.PRIORITY, {"job_id": job_id, "priority": bad})
        assert refused["error"]["code"] == "invalid", refused
    with pytest.raises(ApiError) as err:
        await client.set_priority(new_job_id(), 10)
    assert err.value.code == "not_found"
    done = await completed_job(runtime, client, b"png", b"npy", seed=9)
    with pytest.raises(ApiError) as err:
        await client.set_priority(done, 10)
    assert err.value.code == "illegal_state"
    job = await runtime.db.get_job(job_id)
    assert job is not None and job.priority == 80
    events = await runtime.db.job_events(job_id)
    assert [e.trigger for e in events if e.trigger == "priority"] == ["priority"]
    assert (await runtime.db.get_job(done)).priority == 50  # type: ignore[union-attr]


async def test_pause_unreleases_idle_tiles_resume_releases_them_again(
    gateway: Gateway, runtime: Runtime, client: TesseraClient, nc: NATS, names: Names
) -> None:
    job_id = await _submit(client)
    db = runtime.db
    await db.plan_tiles(job_id, [(0, 0, 16, 16), (16, 0, 32, 16), (0, 16, 16, 32)])
    await db.mark_published(job_id, [0, 1, 2], 0)
    # tile 1 failed retryably (its message waits for a redelivery), tile 2 is being rendered
    assert await db.fence_tile(job_id, 1, token=5, attempt_id="a1", node="w")
    await db.fail_tile(
        job_id, 1, token=5, attempt_id="a1", trigger=TileTrigger.RETRYABLE_FAILURE, error_code="x",
        error="x", node="w", outcome="retryable",
    )  # fmt: skip
    assert await db.fence_tile(job_id, 2, token=6, attempt_id="a2", node="w")
    js = runtime.js
    sub = await js.subscribe(names.event_subject(job_id, EventKind.JOB_PAUSED),
                             stream=runtime.names.stream(STREAM_EVENTS))  # fmt: skip
    reply = await client.pause(job_id)
    assert reply == {"job_id": job_id, "state": "paused", "tiles_unreleased": 2}
    event = await sub.next_msg(timeout=10)  # the workers' cue to stop at their next pass
    assert event.subject == names.event_subject(job_id, EventKind.JOB_PAUSED)
    tiles = await db.list_tiles(job_id)
    assert [(t.state, t.published_at is None) for t in tiles] == [
        (TileState.QUEUED, True), (TileState.QUEUED, True), (TileState.LEASED, False),
    ], "idle tiles unreleased; the leased one is its owner's to hand back"  # fmt: skip
    pauses = [e for e in await db.job_events(job_id) if e.trigger == "pause"]
    assert [(e.tile_index, e.from_state, e.to_state) for e in pauses] == [
        (None, "progressing", "paused"), (0, "queued", "queued"),
        (1, "failed_retryable", "queued"),
    ]  # fmt: skip
    again = await client.pause(job_id)  # a repeat changes nothing
    assert again["tiles_unreleased"] == 0
    assert len([e for e in await db.job_events(job_id) if e.trigger == "pause"]) == 3
    # the owner stops and hands its tile back, fenced by its token
    assert not await db.unrelease_tile(job_id, 2, token=4, attempt_id="a2", node="w")
    assert await db.unrelease_tile(job_id, 2, token=6, attempt_id="a2", node="w")
    outcomes = {a.attempt_id: a.outcome for a in await db.attempts(job_id)}
    assert outcomes["a2"] == "paused"
    woken = await js.subscribe(names.event_subject(job_id, EventKind.JOB_RESUMED),
                               stream=runtime.names.stream(STREAM_EVENTS))  # fmt: skip
    resumed = await client.resume(job_id)
    assert resumed == {"job_id": job_id, "state": "running"}
    await woken.next_msg(timeout=10)  # wakes the dispatchers
    await woken.unsubscribe()
    tiles = await db.list_tiles(job_id)
    assert all(t.state is TileState.QUEUED and t.published_at is None for t in tiles)
    # the dispatcher's next round releases every tile again, each under a new generation
    released = await db.release_tiles({"tessera": 10}, limit=10, usage_window=300)
    # (each un-released under generation 1, released again as 2)
    assert sorted((t.tile_index, t.generation) for t in released.tiles) == [(0, 2), (1, 2), (2, 2)]
    trail = [(e.from_state, e.to_state) for e in await db.job_events(job_id)
             if e.trigger == "resume"]  # fmt: skip
    assert trail == [("paused", "running")]
    await sub.unsubscribe()


async def test_pause_and_resume_refuse_illegal_states_and_write_nothing(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    done = await completed_job(runtime, client, b"png", b"npy", seed=5)
    queued = await _submit(client, seed=6)
    before = {j: await runtime.db.job_events(j) for j in (done, queued)}
    with pytest.raises(ApiError) as err:
        await client.pause(done)
    assert err.value.code == "illegal_state"
    with pytest.raises(ApiError) as err:
        await client.resume(queued)
    assert err.value.code == "illegal_state" and "paused" in err.value.message
    for call in (client.pause, client.resume):
        with pytest.raises(ApiError) as err:
            await call(new_job_id())
        assert err.value.code == "not_found"
    assert {j: await runtime.db.job_events(j) for j in (done, queued)} == before
    assert (await client.status(done))["state"] == "completed"
    assert (await client.status(queued))["state"] == "queued"
    failed = await _submit(client, seed=7)
    await runtime.db.transition_job(failed, JobTrigger.TERMINAL_FAILURE, error_code="x")
    with pytest.raises(ApiError) as err:
        await client.pause(failed)
    assert err.value.code == "illegal_state"


async def test_project_set_upserts_and_audits_with_its_actor(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    await _submit(client)  # project "gw" has a job
    first = await client.project_set("studio", weight=2.5, max_in_flight=4, actor="alice")
    assert first == {"name": "studio", "weight": 2.5, "max_in_flight": 4, "actor": "alice"}
    second = await client.project_set("studio", weight=1.0)
    assert second["max_in_flight"] is None and second["actor"].startswith("gateway:")
    rows, events = await _project_rows(runtime)
    assert [(r["name"], r["weight"], r["max_in_flight"]) for r in rows] == [("studio", 1.0, None)]
    assert [(e["project"], e["weight"], e["max_in_flight"], e["actor"]) for e in events] == [
        ("studio", 2.5, 4, "alice"), ("studio", 1.0, None, second["actor"]),
    ]  # fmt: skip
    listed = await client.project_list()
    by_name = {p["name"]: p for p in listed["projects"]}
    assert set(by_name) == {"gw", "studio"}
    assert by_name["gw"]["configured"] is False and by_name["gw"]["weight"] == 1.0
    assert by_name["studio"]["configured"] is True
    assert listed["window_seconds"] == runtime.settings.scheduler.fair_share_window
    shown = await client.project_show("studio")
    assert shown["project"] == by_name["studio"]


@pytest.mark.parametrize(
    "request_body",
    [{"name": "p", "weight": 0}, {"name": "p", "weight": -1}, {"name": "p", "weight": 1e300},
     {"name": "p", "weight": 1, "max_in_flight": 0}, {"name": "bad name", "weight": 1}],
)  # fmt: skip
async def test_bad_project_settings_are_invalid_and_write_nothing(
    gateway: Gateway, runtime: Runtime, nc: NATS, names: Names, request_body: dict[str, Any]
) -> None:
    reply = await _raw(nc, names, ApiVerb.PROJECT_SET, request_body)
    assert reply["ok"] is False and reply["error"]["code"] == "invalid", reply
    assert await _project_rows(runtime) == ([], [])


async def test_project_show_of_an_unknown_project_is_not_found(
    gateway: Gateway, client: TesseraClient
) -> None:
    with pytest.raises(ApiError) as err:
        await client.project_show("nobody")
    assert err.value.code == "not_found"


async def test_project_share_counts_core_seconds_within_the_window(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    a, b = await _submit(client, project="a", seed=1), await _submit(client, project="b", seed=2)
    for job_id in (a, b):
        await runtime.db.plan_tiles(job_id, [(0, 0, 16, 16)])
    conn = await asyncpg.connect(runtime.settings.database_url)
    try:
        for job_id, secs in ((a, 30), (b, 10)):
            await conn.execute(
                """
                INSERT INTO attempts (attempt_id, job_id, tile_index, kind, started_at, ended_at,
                                      outcome)
                VALUES ($1, $2, 0, 'tile', now() - make_interval(secs => $3), now(), 'done')
                """,
                f"att-{job_id}", job_id, float(secs),
            )  # fmt: skip
    finally:
        await conn.close()
    shares = {p["name"]: p for p in (await client.project_list())["projects"]}
    assert shares["a"]["share"] == pytest.approx(0.75, abs=0.01)
    assert shares["b"]["share"] == pytest.approx(0.25, abs=0.01)
    assert shares["a"]["queued"] == 1 and shares["a"]["in_flight"] == 0
