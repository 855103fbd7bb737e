"""The main job end to end: four separate service processes, real servers, exact pixels."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from nats.aio.client import Client as NATS

from proto import names as n
from proto.messages import TileMessage
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.core.lifecycle import JobTrigger
from shared.core.runs import run_length
from shared.metadata import MetadataStore
from shared.objectstore import DirectoryStore, ObjectStore
from tests.e2e.conftest import reference_png
from tests.e2e.flows import (
    announce_idle_worker,
    request,
    result_bytes,
    settle,
    submit,
    workers_live,
)
from tests.harness import ServiceProcesses
from tests.helpers import eventually


async def test_one_job_gives_the_reference_png(
    services: ServiceProcesses, client: TesseraClient, objects: ObjectStore, db: MetadataStore
) -> None:
    services.start_all(workers=1)
    body = request()
    reply = await submit(client, body)
    assert reply["created"] is True
    status = await settle(client, reply["job_id"], services)
    png = await result_bytes(objects, status)
    assert png == reference_png(body)
    assert status["tiles_done"] == status["tiles_total"] == 12
    assert status["result_location"].startswith(f"renders/{reply['job_id']}/")
    events = await db.job_events(reply["job_id"])
    assert [e.to_state for e in events if e.entity == "job"][-1] == "completed"
    # The same image with tile_size auto: the scheduler picks the edge (the cost measured on
    # the job above, one live kernel thread), status shows it, and the pixels are the same.
    auto = await submit(client, body | {"tile_size": "auto"})
    assert auto["job_id"] != reply["job_id"], "auto is another logical request"
    settled = await settle(client, auto["job_id"], services)
    assert settled["state"] == "completed" and settled["tile_auto"] is True
    assert settled["tile_size"] > 0 and settled["tiles_total"] >= 1
    assert await result_bytes(objects, settled) == png


async def test_concurrent_identical_submits_make_one_job_and_one_png(
    services: ServiceProcesses, client: TesseraClient, objects: ObjectStore, db: MetadataStore
) -> None:
    services.start_all(workers=1)
    body = request(spp=4)
    first = await submit(client, body)  # the gateway is up once this answers
    replies = [first, *await asyncio.gather(*(submit(client, body) for _ in range(19)))]
    assert {r["job_id"] for r in replies} == {first["job_id"]}
    assert sum(r["created"] for r in replies) == 1
    assert sum(r["duplicate"] for r in replies) == 19
    status = await settle(client, first["job_id"], services)
    assert await result_bytes(objects, status) == reference_png(body)
    assert len(await db.list_jobs(limit=100)) == 1
    renders = await objects.list(f"renders/{first['job_id']}/")
    assert len([o for o in renders if o.key.endswith(".png")]) == 1


async def test_a_five_frame_range(
    services: ServiceProcesses, client: TesseraClient, objects: ObjectStore
) -> None:
    services.start_all(workers=1)
    bodies = [request(frame=f, width=32, height=24, spp=4) for f in range(5)]
    replies = [await submit(client, b) for b in bodies]
    assert len({r["job_id"] for r in replies}) == 5
    pngs = []
    for reply in replies:
        status = await settle(client, reply["job_id"], services)
        pngs.append(await result_bytes(objects, status))
    assert len(set(pngs)) == 5, "every frame is a different image"
    assert pngs[3] == reference_png(bodies[3])


@pytest.mark.parametrize("results", ["inline", "objects"])
async def test_two_workers_one_finalizer_on_sixteen_tiles(
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
    nc: NATS,
    e2e_settings: Settings,
    results: str,
) -> None:
    # 16x16 tiles: 6 KiB results, inline by default; as objects (read ahead by the finalizer)
    # when the inline limit is 0.
    if results == "objects":
        services.env["TESSERA_INLINE_RESULT_BYTES"] = "0"
    # One tile in hand each: a worker rendering a tile has no pull outstanding, so a second tile
    # released meanwhile can only go to the other. With the default (twice its threads) a
    # worker's batch pull could take every tile of a round, and with tiles of a few ms one
    # worker rendered all 16 (CI, 2026-12-06, twice: at 16 spp, then at 64).
    services.env["TESSERA_WORKER_IN_HAND"] = "1"
    # Each tile its own message: by default these 16 short tiles (16,384 pixel-samples each,
    # about 140 ms of one core in all) would share one run, so one worker.
    services.env["TESSERA_DISPATCH_RUN"] = "1"
    services.start_all(workers=2)
    names = n.Names(e2e_settings.deployment.namespace)
    await workers_live(nc.jetstream(), names, {"worker-1", "worker-2"})
    body = request(width=64, height=64, spp=64)
    reply = await submit(client, body)
    job_id = reply["job_id"]
    status = await settle(client, job_id, services)
    assert status["tiles_total"] == 16
    assert await result_bytes(objects, status) == reference_png(body)
    nodes = {a.node for a in await db.attempts(job_id) if a.tile_index is not None}
    assert nodes == {"worker-1", "worker-2"}, "both workers rendered tiles"
    inline, stored = await db.tile_results(job_id), await objects.list(f"tiles/{job_id}/")
    tiles = await db.list_tiles(job_id)
    if results == "inline":
        assert sorted(inline) == list(range(16)) and stored == []
        assert all(t.result_key is None for t in tiles)
        assert {i: sha for i, (sha, _) in inline.items()} == {
            t.tile_index: t.result_sha256 for t in tiles
        }
    else:
        assert inline == {} and len(stored) == 16
        assert sorted(o.key for o in stored) == sorted(str(t.result_key) for t in tiles)


async def test_cancel_mid_render_stops_within_a_pass(
    services: ServiceProcesses, client: TesseraClient, db: MetadataStore, objects: ObjectStore
) -> None:
    services.start_all(workers=1)
    body = request(width=32, height=32, spp=20000, tile_size=16)
    reply = await submit(client, body)
    job_id = reply["job_id"]

    async def rendering() -> bool:
        tiles = await db.list_tiles(job_id)
        return any(t.samples_done > 0 for t in tiles)

    await eventually(rendering, timeout=60, what="a tile has checkpointed progress")
    cancelled = await client.cancel(job_id)
    assert cancelled["state"] == "cancelled"

    async def attempts_ended() -> bool:
        attempts = await db.attempts(job_id)
        return bool(attempts) and all(a.ended_at is not None for a in attempts)

    await eventually(attempts_ended, timeout=30, what="every attempt has ended")
    status = await client.status(job_id)
    assert status["state"] == "cancelled"
    assert status["result_location"] is None
    attempts = await db.attempts(job_id)
    assert "cancelled" in {a.outcome for a in attempts}
    assert all(t.state.value != "done" for t in await db.list_tiles(job_id))
    assert isinstance(objects, DirectoryStore)
    left = objects.root / "checkpoints" / job_id

    async def cleaned_up() -> bool:  # checkpoints, and the directories they were in
        return not await objects.list(f"checkpoints/{job_id}/") and not left.exists()

    await eventually(cleaned_up, timeout=30, what="the cancelled tiles' checkpoints are gone")


async def test_a_redelivered_tile_is_not_rendered_twice_in_parallel(
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
    nc: NATS,
    e2e_settings: Settings,
) -> None:
    services.start_all(workers=2)
    body = request(width=16, height=16, spp=12000, tile_size=16)  # one long tile
    reply = await submit(client, body)
    job_id = reply["job_id"]

    async def leased() -> bool:
        tile = await db.get_tile(job_id, 0)
        return tile is not None and tile.state.value in ("leased", "progressing")

    await eventually(leased, timeout=60, what="the tile is being rendered")
    names = n.Names(e2e_settings.deployment.namespace)
    copy = TileMessage(job_id, 0, generation=7).encode()
    await nc.jetstream().publish(
        names.tile_subject(job_id, 0), copy, headers={"Nats-Msg-Id": n.tile_msg_id(job_id, 0, 7)}
    )

    def copy_refused() -> bool:
        logs = [p.log_path.read_text() for p in services.procs.values()]
        return any("lease held by another owner" in text for text in logs)

    await eventually(copy_refused, timeout=30, what="the copy is delivered and backed off")
    status = await settle(client, job_id, services)
    assert await result_bytes(objects, status) == reference_png(body)
    attempts = [a for a in await db.attempts(job_id) if a.tile_index == 0]
    assert len(attempts) == 1, f"the copy never started a second render: {attempts}"


async def test_sweeper_republishes_a_deleted_tile_message(
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
    nc: NATS,
    e2e_settings: Settings,
) -> None:
    # runs of two (the default work would put the whole job in one)
    short_runs = {"TESSERA_DISPATCH_RUN_WORK": "4096"}
    for service in ("gateway", "scheduler", "finalizer"):  # no worker yet
        services.start(service, env=short_runs if service == "scheduler" else None)
    names = n.Names(e2e_settings.deployment.namespace)
    js = nc.jetstream()
    stream = names.stream(n.STREAM_TILES)
    # A live worker as the dispatcher sees one (6 threads: a window of 12), that renders nothing.
    await announce_idle_worker(js, names)
    body = request()
    # 16 px tiles at 8 spp (2,048 pixel-samples) go out two to a message with that work
    dispatch = e2e_settings.scheduler
    run = run_length(body["spp"], 16 * 16, most=dispatch.dispatch_run,
                     work=int(short_runs["TESSERA_DISPATCH_RUN_WORK"]))  # fmt: skip
    assert run == 2
    reply = await submit(client, body)
    job_id = reply["job_id"]

    def published(count: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return (await js.stream_info(stream)).state.messages == count

        return check

    await eventually(published(6), timeout=30, what="all 12 tiles published, 6 runs")
    lost = await js.get_last_msg(stream, names.tile_subject(job_id, 4, run=2))
    assert lost.seq is not None
    await js.delete_msg(stream, lost.seq)

    async def republished() -> bool:
        tiles = [await db.get_tile(job_id, i) for i in (4, 5)]
        # released as 1, swept as 2
        return all(t is not None and t.generation == 2 for t in tiles)

    await eventually(republished, timeout=30, what="the sweeper re-publishes tiles 4 and 5")
    # (the sweeper stamps the rows first, then publishes, each tile alone: the messages land
    # just after)
    await eventually(published(7), timeout=30, what="tiles 4 and 5 back, one message each")
    for i in (4, 5):
        again = await js.get_last_msg(stream, names.tile_subject(job_id, i))
        assert TileMessage.decode(again.data or b"") == TileMessage(job_id, i, 2)
    services.start("worker", name="worker-1")
    status = await settle(client, job_id, services)
    assert await result_bytes(objects, status) == reference_png(body)


async def test_sweeper_republishes_a_lost_job_message(
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    nc: NATS,
    e2e_settings: Settings,
) -> None:
    services.start("gateway")
    body = request(spp=2)
    job_id = (await submit(client, body))["job_id"]
    names = n.Names(e2e_settings.deployment.namespace)
    js = nc.jetstream()
    stream = names.stream(n.STREAM_JOBS)
    lost = await js.get_last_msg(stream, names.job_subject(job_id))
    assert lost.seq is not None
    await js.delete_msg(stream, lost.seq)  # as if the gateway died before its publish landed
    for service in ("scheduler", "worker", "finalizer"):
        services.start(service)
    status = await settle(client, job_id, services)
    assert await result_bytes(objects, status) == reference_png(body)


async def test_retry_of_a_job_whose_finalization_failed_finalizes_it(
    services: ServiceProcesses, client: TesseraClient, objects: ObjectStore, db: MetadataStore
) -> None:
    for service in ("gateway", "scheduler", "worker"):  # no finalizer: tiles finish, job waits
        services.start(service)
    body = request(spp=2)
    job_id = (await submit(client, body))["job_id"]
    await eventually(lambda: db.all_tiles_done(job_id), timeout=60, what="every tile done")
    # The finalizer gave up on this job for good (as after a terminal finalization error):
    failed = await db.transition_job(
        job_id, JobTrigger.TERMINAL_FAILURE, error_code="kernel_failure", error="injected"
    )
    assert failed.state.value == "failed_terminal"
    assert (await client.retry(job_id))["state"] == "queued"
    services.start("finalizer")
    status = await settle(client, job_id, services)
    assert await result_bytes(objects, status) == reference_png(body)
    assert status["generation"] == 1
