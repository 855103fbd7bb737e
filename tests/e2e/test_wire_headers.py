"""Every internal message a real pipeline run publishes names itself in readable headers."""

from __future__ import annotations

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from proto import names as n
from proto.messages import JobEvent, JobMessage, Room, TileDone, TileMessage, TilesDone
from services.client.api import TesseraClient
from shared.core.config import Settings
from tests.e2e.flows import request, settle, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually


async def test_pipeline_messages_carry_kind_job_and_tile_headers(
    services: ServiceProcesses, client: TesseraClient, nc: NATS, e2e_settings: Settings
) -> None:
    names = n.Names(e2e_settings.deployment.namespace)
    by_id: dict[str, Msg] = {}  # a core subscriber also gets publishes absorbed as duplicates

    async def keep(msg: Msg) -> None:
        by_id.setdefault((msg.headers or {}).get("Nats-Msg-Id", f"none-{len(by_id)}"), msg)

    # JOBS and TILES are work queues (gone once acked): watch what is published instead.
    subs = [
        await nc.subscribe(s, cb=keep)
        for s in (names.jobs_subjects, names.tiles_subjects, names.events_subjects)
    ]
    rooms: list[Msg] = []  # core NATS, no message id: each one kept

    async def room(msg: Msg) -> None:
        rooms.append(msg)

    subs.append(await nc.subscribe(names.room_subject, cb=room))
    await nc.flush()
    services.start_all(workers=1)
    reply = await submit(client, request(width=32, height=32, spp=2))  # 4 tiles of 16 px
    job = reply["job_id"]
    status = await settle(client, job, services)
    assert status["state"] == "completed"

    def kinds() -> list[str]:
        return sorted((m.headers or {}).get(n.HDR_KIND, "?") for m in by_id.values())

    # the 4 tiles (16 px at 2 spp) are tiny: one message carries them as a run
    expected = ["job", "job-completed", "tile", *["tile-done"] * 4, "tiles-done"]
    await eventually(lambda: kinds() == expected, timeout=10, what=f"messages ({kinds()})")
    # the run's message left the worker's hand: the dispatchers hear its 4 tiles in one Room
    await eventually(lambda: rooms, timeout=10, what="the worker's Room message")
    for sub in subs:
        await sub.unsubscribe()

    tiles_seen: dict[str, set[str]] = {"tile": set(), "tile-done": set()}
    for msg in by_id.values():
        headers = msg.headers or {}
        kind = headers[n.HDR_KIND]
        assert headers[n.HDR_JOB] == job, headers
        assert headers["Nats-Msg-Id"], headers  # the existing header is still there
        body: JobMessage | TileMessage | TileDone | TilesDone | JobEvent
        if kind == "job":
            body = JobMessage.decode(msg.data)
            assert msg.subject == names.job_subject(job)
            assert headers[n.HDR_GENERATION] == "0"
        elif kind == "tile":
            body = TileMessage.decode(msg.data)
            assert msg.subject == names.tile_subject(job, body.tile_index, run=body.run)
            assert (headers[n.HDR_TILE], headers[n.HDR_RUN]) == ("0", "4")
            tiles_seen[kind].update(str(i) for i in body.tiles)
        elif kind == "tile-done":
            body = TileDone.decode(msg.data)
            assert headers[n.HDR_ATTEMPT] == body.attempt_id
            tiles_seen[kind].add(headers[n.HDR_TILE])
        elif kind == "tiles-done":  # one, from the worker whose commit finished the job
            body = TilesDone.decode(msg.data)
            assert msg.subject == names.event_subject(job, n.EventKind.TILES_DONE)
        else:
            body = JobEvent.decode(msg.data)
            assert body.kind.value == kind == "job-completed"
        assert headers == {"Nats-Msg-Id": headers["Nats-Msg-Id"], **body.headers()}
    assert tiles_seen == {"tile": {"0", "1", "2", "3"}, "tile-done": {"0", "1", "2", "3"}}
    assert [Room.decode(m.data) for m in rooms] == [Room(4)]
    assert [m.headers for m in rooms] == [{n.HDR_KIND: "room"}]

    # and what `nats stream view EVENTS` reads back from the stream itself
    events = names.stream(n.STREAM_EVENTS)
    stored = await nc.jetstream().get_last_msg(
        events, names.event_subject(job, n.EventKind.JOB_COMPLETED)
    )
    assert (stored.headers or {})[n.HDR_KIND] == "job-completed"
    assert (stored.headers or {})[n.HDR_JOB] == job
