"""Pause and resume end to end (real NATS, PostgreSQL, worker processes): lossless, exact pixels.

A paused job's in-flight tiles stop at their next pass boundary, checkpoint, hand the tile back
unreleased and release their leases; resumed, every tile continues from that checkpoint, and the
image is bit-identical to an uninterrupted render.
"""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NATS

from proto import names as n
from services.cli.ops.top import lease_of
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.metadata import MetadataStore
from shared.objectstore import ObjectStore
from tests.e2e.conftest import reference_png
from tests.e2e.flows import announce_idle_worker, request, result_bytes, settle, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually

#: four 16x16 tiles of some thousands of samples: seconds each, dozens of passes
LONG = {"width": 32, "height": 32, "tile_size": 16, "spp": 3000}


async def rendering(db: MetadataStore, job_id: str) -> bool:
    """Some tile has checkpointed progress and is still being rendered."""
    return any(
        t.samples_done > 0 and t.state.value in ("leased", "progressing")
        for t in await db.list_tiles(job_id)
    )


async def leases_of(nc: NATS, settings: Settings, job_id: str, tiles: int) -> list[Any]:
    """The live leases of the job's tiles, read from the lease KV."""
    names = n.Names(settings.deployment.namespace)
    bucket, js = names.bucket(n.BUCKET_LEASES), nc.jetstream()
    found = [await lease_of(js, bucket, n.lease_key_tile(job_id, i)) for i in range(tiles)]
    return [lease for lease in found if lease is not None]


async def wait_paused(
    db: MetadataStore, nc: NATS, settings: Settings, job_id: str, tiles: int, dead: str = ""
) -> dict[int, int]:
    """Until no tile of the paused job is held (rows, attempts, leases); samples per tile.

    Attempts of the ``dead`` node (SIGKILLed) stay open, as after any takeover."""

    async def quiet() -> bool:
        held = [
            t for t in await db.list_tiles(job_id) if t.state.value in ("leased", "progressing")
        ]
        attempts = await db.attempts(job_id)
        open_ = [a for a in attempts if a.ended_at is None and a.node != dead]
        return not held and not open_ and not await leases_of(nc, settings, job_id, tiles)

    await eventually(quiet, timeout=60, what="every tile of the paused job handed back")
    return {t.tile_index: t.samples_done for t in await db.list_tiles(job_id)}


async def test_pause_resume_complete_is_bit_identical_and_resumes_each_checkpoint(
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
    nc: NATS,
    e2e_settings: Settings,
) -> None:
    services.start_all(workers=1)
    body = request(**LONG)
    job_id = (await submit(client, body))["job_id"]
    await eventually(lambda: rendering(db, job_id), timeout=90, what="a tile in flight")
    paused = await client.pause(job_id)
    assert paused["state"] == "paused"
    samples = await wait_paused(db, nc, e2e_settings, job_id, 4)
    status = await client.status(job_id)
    assert status["state"] == "paused"
    tiles = {t.tile_index: t for t in await db.list_tiles(job_id)}
    stopped = [a for a in await db.attempts(job_id) if a.outcome == "paused"]
    assert stopped, "an in-flight tile stopped for the pause"
    for attempt in stopped:
        tile = tiles[attempt.tile_index or 0]
        assert tile.state.value == "queued" and tile.published_at is None, "held unreleased"
    # the pointer of every paused tile names the checkpoint of the samples it stopped at
    names = n.Names(e2e_settings.deployment.namespace)
    kv = await nc.jetstream().key_value(names.bucket(n.BUCKET_PROGRESS))
    for attempt in stopped:
        index = attempt.tile_index or 0
        entry = await kv.get(n.progress_key(job_id, index))
        assert (
            entry.value is not None and f'"samples_done":{samples[index]}' in entry.value.decode()
        )
    ended_before = {a.attempt_id for a in await db.attempts(job_id)}
    assert (await client.resume(job_id))["state"] == "running"
    final = await settle(client, job_id, services, timeout=180)
    assert final["state"] == "completed"
    assert await result_bytes(objects, final) == reference_png(body), "bit-identical"
    after = [a for a in await db.attempts(job_id) if a.attempt_id not in ended_before]
    for attempt in stopped:
        at = attempt.tile_index or 0
        resumed = [a for a in after if a.tile_index == at]
        assert resumed, f"tile {at} rendered again after the resume"
        assert resumed[0].resumed_from == samples[at] > 0, (
            f"tile {at} resumed from {resumed[0].resumed_from}, paused at {samples[at]}"
        )
    trail = [(e.from_state, e.to_state, e.trigger) for e in await db.job_events(job_id)
             if e.entity == "job"]  # fmt: skip
    assert ("progressing", "paused", "pause") in trail and ("paused", "running", "resume") in trail


async def test_a_tiles_message_of_a_paused_job_is_handed_back_and_never_lost(
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
    nc: NATS,
    e2e_settings: Settings,
) -> None:
    # No worker yet, but one announced (so the dispatcher releases the tiles): pause while
    # every tile still waits in TILES; the worker started then receives their messages for a
    # paused job, hands each back unreleased and acks.
    services.start("gateway")
    services.start("scheduler")
    services.start("finalizer")
    await announce_idle_worker(nc.jetstream(), n.Names(e2e_settings.deployment.namespace))
    body = request(width=32, height=32, tile_size=16, spp=8)
    job_id = (await submit(client, body))["job_id"]

    async def planned() -> bool:
        tiles = await db.list_tiles(job_id)
        return len(tiles) == 4 and all(t.published_at is not None for t in tiles)

    await eventually(planned, timeout=60, what="the tiles planned and released")
    await client.pause(job_id)
    services.start("worker", name="worker-1")

    async def handed_back() -> bool:
        tiles = await db.list_tiles(job_id)
        return all(t.state.value == "queued" and t.published_at is None for t in tiles)

    await eventually(handed_back, timeout=60, what="the paused job's tiles unreleased")
    stream = n.Names(e2e_settings.deployment.namespace).stream(n.STREAM_TILES)

    async def consumed() -> bool:  # the worker took every message of the paused job and acked
        return (await nc.jetstream().stream_info(stream)).state.messages == 0

    await eventually(consumed, timeout=60, what="the paused job's TILES messages acked")
    assert await handed_back(), "taking the messages released nothing"
    assert not [a for a in await db.attempts(job_id) if a.tile_index is not None]
    await client.resume(job_id)
    final = await settle(client, job_id, services, timeout=120)
    assert await result_bytes(objects, final) == reference_png(body)


@pytest.mark.parametrize("point", ["worker.after_pause_checkpoint", "worker.before_unrelease"])
async def test_a_worker_killed_while_its_tile_pauses_loses_nothing(
    point: str,
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
    nc: NATS,
    e2e_settings: Settings,
) -> None:
    # worker-1 dies right after its pause checkpoint (at either point), before handing the tile
    # back: the tile is left leased by a dead owner. worker-2 gets the message again (ack_wait),
    # takes the expired lease, hands the tile back unreleased; resumed, it continues from that
    # checkpoint.
    services.start_all(workers=0)
    one = services.start("worker", name="worker-1",
                         env={"TESSERA_CRASH_AT": point})  # fmt: skip
    # one tile, long enough to be mid-render when the pause lands (at 3000 spp it took about
    # 0.4 s and could finish first, so worker-1 never reached its point)
    body = request(width=16, height=16, tile_size=16, spp=30000)
    job_id = (await submit(client, body))["job_id"]
    await eventually(lambda: rendering(db, job_id), timeout=90, what="the tile in flight")
    await client.pause(job_id)
    await eventually(lambda: not one.alive(), timeout=60, what="worker-1 killed at its point")
    checkpointed = (await db.get_tile(job_id, 0)).samples_done  # type: ignore[union-attr]
    assert checkpointed > 0
    services.start("worker", name="worker-2")
    samples = await wait_paused(db, nc, e2e_settings, job_id, 1, dead="worker-1")
    assert samples[0] == checkpointed, "the pause checkpoint survived the kill"
    handed = [e for e in await db.job_events(job_id) if e.trigger == "pause" and e.tile_index == 0]
    assert handed and handed[-1].error_code == "lease_expired" and handed[-1].node == "worker-2"
    tile = await db.get_tile(job_id, 0)
    assert tile is not None and tile.state.value == "queued" and tile.published_at is None
    before = {a.attempt_id for a in await db.attempts(job_id)}
    await client.resume(job_id)
    final = await settle(client, job_id, services, timeout=180)
    assert await result_bytes(objects, final) == reference_png(body)
    resumed = [a for a in await db.attempts(job_id) if a.attempt_id not in before]
    assert resumed and resumed[0].resumed_from == checkpointed


async def test_a_pause_landing_on_a_commit_keeps_the_commit_and_the_pause(
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
    nc: NATS,
    e2e_settings: Settings,
) -> None:
    # worker-1 is stopped dead between its fenced commit and the tile-done event; the pause
    # comes exactly then. The commit stands, the job stays paused, its other tiles hand back.
    services.start_all(workers=0)
    one = services.start("worker", name="worker-1",
                         env={"TESSERA_CRASH_AT": "worker.after_commit"})  # fmt: skip
    body = request(width=32, height=32, tile_size=16, spp=400)
    job_id = (await submit(client, body))["job_id"]
    await eventually(lambda: not one.alive(), timeout=90, what="worker-1 killed after a commit")
    await client.pause(job_id)
    services.start("worker", name="worker-2")
    samples = await wait_paused(db, nc, e2e_settings, job_id, 4, dead="worker-1")
    tiles = await db.list_tiles(job_id)
    assert sum(t.state.value == "done" for t in tiles) >= 1, "the commit landed"
    assert (await client.status(job_id))["state"] == "paused"
    assert all(t.state.value in ("done", "queued") for t in tiles)
    assert all(t.published_at is None for t in tiles if t.state.value == "queued")
    await client.resume(job_id)
    final = await settle(client, job_id, services, timeout=180)
    assert final["state"] == "completed"
    assert await result_bytes(objects, final) == reference_png(body)
    assert samples  # every tile accounted for
