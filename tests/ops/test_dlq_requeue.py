"""Poison is dead-lettered (and counted); a dry run writes nothing; requeue finishes the job.

A poison tile is re-rendered; a poison finalization (a finalizer that dies on the job's
tile-done event every time) is handed back to the finalizer with every tile still done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS

from proto import names as n
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.metadata import MetadataStore
from shared.objectstore import ObjectStore
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, result_bytes, settle, submit, workers_live
from tests.harness import ServiceProcesses
from tests.helpers import eventually
from tests.ops.conftest import CliRunner, metric, start_with_port

POISON = {"TESSERA_CRASH_AT": "worker.after_lease"}


async def test_poison_tile_dead_letter_dry_run_and_requeue(
    e2e_env: dict[str, str],
    tmp_path: Path,
    client: TesseraClient,
    db: MetadataStore,
    objects: ObjectStore,
    nc: NATS,
    e2e_settings: Settings,
    tessera: CliRunner,
) -> None:
    # every service declares the consumers, so every one must agree on max_deliver
    procs = ServiceProcesses(e2e_env | {"TESSERA_MAX_DELIVER": "2"}, tmp_path / "logs")
    try:
        await _scenario(procs, client, db, objects, nc, e2e_settings, tessera)
    finally:
        procs.stop_all()


async def _scenario(procs, client, db, objects, nc, settings, tessera) -> None:
    procs.start("finalizer")
    _, gateway_port = start_with_port(procs, "gateway")
    _, scheduler_port = start_with_port(procs, "scheduler")
    worker = procs.start("worker", name="worker-1", env=POISON)
    body = request(width=16, height=16, spp=4, tile_size=16)
    job_id = (await submit(client, body))["job_id"]
    for _ in range(2):  # each delivery kills the worker right after it took the lease
        assert worker.wait(timeout=60) is not None, procs.logs()
        worker = procs.restart("worker-1", env=POISON)  # its pull lets the advisory out

    async def dead() -> bool:
        return (await client.status(job_id))["state"] == "dead_lettered"

    await eventually(dead, timeout=60, what="the job is dead-lettered")
    letters = "tessera_dead_letters_total"
    assert await metric(scheduler_port, letters, unit="tile", reason="max_deliveries") == 1
    names = n.Names(settings.deployment.namespace)
    js = nc.jetstream()
    letter = await js.get_last_msg(names.stream(n.STREAM_DLQ), names.dlq_subject(job_id, "tile-0"))
    headers = letter.headers or {}  # what `nats stream view DLQ` shows of the scheduler's copy
    source = headers.pop(n.HDR_SOURCE, "")
    assert source.startswith(f"{names.stream(n.STREAM_TILES)}:"), source
    assert headers == {
        "Nats-Msg-Id": n.dlq_msg_id(names.stream(n.STREAM_TILES), int(source.split(":")[1])),
        n.HDR_KIND: n.KIND_DEAD_LETTER,
        n.HDR_JOB: job_id,
        n.HDR_UNIT: "tile-0",
        n.HDR_TILE: "0",
        n.HDR_REASON: "max_deliveries",
        n.HDR_DELIVERIES: "2",
    }
    before = await _state(js, names, db, job_id)
    dry = await tessera("dlq", "requeue", "--job", job_id, "--dry-run")
    assert dry.status == 0, dry.err
    assert "requeue" in dry.out and "max_deliveries" in dry.out and "would requeue 1" in dry.out
    assert await _state(js, names, db, job_id) == before, "a dry run writes nothing"

    procs.procs["worker-1"].stop()
    procs.start("worker", name="worker-1")  # a healthy worker
    await workers_live(js, names, {"worker-1"})  # consuming before the tile comes back
    real = await tessera("dlq", "requeue", "--job", job_id, "--rate", "5/s")
    assert real.status == 0, real.err
    assert "requeued 1" in real.out, real.out
    status = await settle(client, job_id, procs)
    assert await result_bytes(objects, status) == reference_png(body)
    assert (await client.dlq_list(job_id=job_id))["dead_letters"] == []
    assert await metric(gateway_port, "tessera_dlq_requeued_total", unit="tile") == 1
    tile = await db.get_tile(job_id, 0)
    assert tile is not None and tile.generation == before[2][0][1] + 1
    triggers = [e.trigger for e in await db.job_events(job_id) if e.tile_index == 0]
    assert "requeue" in triggers, triggers


async def test_a_finalization_dead_letter_requeued_finalizes_the_job(
    e2e_env: dict[str, str],
    tmp_path: Path,
    client: TesseraClient,
    db: MetadataStore,
    objects: ObjectStore,
    tessera: CliRunner,
) -> None:
    procs = ServiceProcesses(e2e_env | {"TESSERA_MAX_DELIVER": "2"}, tmp_path / "logs")
    try:
        for service in ("gateway", "scheduler"):
            procs.start(service)
        procs.start("worker", name="worker-1")
        poison = {"TESSERA_CRASH_AT": "finalizer.after_finalizing"}
        finalizer = procs.start("finalizer", env=poison)
        body = request(width=16, height=16, spp=4, tile_size=16)  # one tile: one tile-done event
        job_id = (await submit(client, body))["job_id"]
        for _ in range(2):  # each delivery kills the finalizer as it starts finalizing
            assert finalizer.wait(timeout=60) is not None, procs.logs()
            finalizer = procs.restart("finalizer", env=poison)  # its pull lets the advisory out

        async def dead() -> bool:
            return (await client.status(job_id))["state"] == "dead_lettered"

        await eventually(dead, timeout=60, what="the job is dead-lettered")
        letters = (await client.dlq_list(job_id=job_id))["dead_letters"]
        assert [letter["unit"] for letter in letters] == [n.DLQ_UNIT_FINAL], letters
        renders = [a.attempt_id for a in await db.attempts(job_id) if a.kind != "final"]
        assert len(renders) == 1

        procs.procs["finalizer"].stop()
        procs.start("finalizer")  # a healthy finalizer
        real = await tessera("dlq", "requeue", "--job", job_id, "--rate", "5/s")
        assert real.status == 0, real.err
        assert "requeued 1" in real.out, real.out
        status = await settle(client, job_id, procs)
        assert await result_bytes(objects, status) == reference_png(body)
        assert status["generation"] == 1
        assert (await client.dlq_list(job_id=job_id))["dead_letters"] == []
        attempts = await db.attempts(job_id)
        assert [a.attempt_id for a in attempts if a.kind != "final"] == renders, "re-rendered"
    finally:
        procs.stop_all()


async def _state(js, names: n.Names, db: MetadataStore, job_id: str) -> tuple[Any, ...]:
    dlq = await js.stream_info(names.stream(n.STREAM_DLQ))
    tiles = await js.stream_info(names.stream(n.STREAM_TILES))
    rows = [(t.state, t.generation, t.updated_at) for t in await db.list_tiles(job_id)]
    job = await db.get_job(job_id)
    assert job is not None
    return dlq.state.messages, tiles.state.messages, rows, (job.state, job.generation)
