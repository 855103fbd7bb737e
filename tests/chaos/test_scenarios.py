"""Scenarios on the session servers: a frozen owner, duplicate deliveries, a poison tile and a
scene the kernel cannot render. Every one ends with the shared invariant checker."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from nats.js.errors import KeyNotFoundError

import kernel
from proto import names as n
from proto.messages import TileMessage
from shared.metadata import Attempt
from tests.chaos.conftest import record
from tests.chaos.invariants import check_job, summary_row
from tests.chaos.rig import DUPLICATE_MESSAGES, Rig, open_rig, tiny
from tests.helpers import eventually

pytestmark = pytest.mark.chaos


async def _tile_attempts(rig: Rig, job_id: str) -> list[Attempt]:
    return [a for a in await rig.db.attempts(job_id) if a.kind == "tile"]


async def test_a_frozen_worker_is_fenced_after_a_takeover(
    chaos_env: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    body = tiny(width=16, height=16, spp=20000)  # one tile, several seconds of work
    async with open_rig(chaos_env, tmp_path / "logs", workers=2) as rig:
        job_id = await rig.submit(body)

        async def rendering() -> Attempt | None:
            tile = await rig.db.get_tile(job_id, 0)
            attempts = await _tile_attempts(rig, job_id)
            return attempts[0] if attempts and tile and tile.samples_done > 0 else None

        first = await eventually(
            rendering, timeout=30, what="the tile has checkpointed", detail=rig.procs.logs
        )
        rig.procs.pause(first.node)  # SIGSTOP: alive, silent, its lease runs out

        async def taken_over() -> Attempt | None:
            later = [a for a in await _tile_attempts(rig, job_id) if a.node != first.node]
            return later[0] if later else None

        second = await eventually(
            taken_over, timeout=20, what="another worker takes over", detail=rig.procs.logs
        )
        assert second.fence > first.fence
        rig.procs.resume(first.node)  # SIGCONT while the new owner renders

        async def first_ended() -> Attempt | None:
            mine = [
                a for a in await _tile_attempts(rig, job_id) if a.attempt_id == first.attempt_id
            ]
            return mine[0] if mine and mine[0].ended_at is not None else None

        await rig.settle(job_id)
        ended = await eventually(
            first_ended, timeout=15, what="the frozen owner stops", detail=rig.procs.logs
        )
        assert ended.outcome is not None and ended.outcome.value in ("lease_lost", "fenced")
        assert rig.procs.procs[first.node].alive(), "the fenced worker keeps serving"
        report = await check_job(rig, job_id, body)
        record(summary_row("SIGSTOP owner past TTL", [report], rig, time.monotonic() - started))
        report.assert_ok()
        assert report.takeovers >= 1 and report.resumes >= 1


async def test_the_same_tiles_delivered_twice_commit_once(
    chaos_env: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    body = tiny(spp=3000)
    async with open_rig(chaos_env, tmp_path / "logs", workers=2) as rig:
        job_id = await rig.submit(body)

        async def leased() -> bool:
            return any(t.state.value in ("leased", "progressing")
                       for t in await rig.db.list_tiles(job_id))  # fmt: skip

        await eventually(leased, timeout=30, what="a tile is being rendered", detail=rig.procs.logs)
        js, names = rig.nc.jetstream(), rig.names
        for i in range(4):  # a copy of every tile under a new generation: not deduplicated
            await js.publish(
                names.tile_subject(job_id, i),
                TileMessage(job_id, i, generation=7).encode(),
                headers={"Nats-Msg-Id": n.tile_msg_id(job_id, i, 7)},
            )
        await rig.settle(job_id)

        async def drained() -> bool:
            info = await js.stream_info(names.stream(n.STREAM_TILES))
            return info.state.messages == 0

        await eventually(drained, timeout=30, what="every copy is consumed", detail=rig.procs.logs)
        report = await check_job(rig, job_id, body)
        record(summary_row("duplicate delivery", [report], rig, time.monotonic() - started))
        report.assert_ok()
        commits = [e for e in await rig.db.job_events(job_id) if e.to_state == "done"]
        assert sorted(e.tile_index for e in commits if e.tile_index is not None) == [0, 1, 2, 3]
        assert len(commits) == 4, "one commit per tile"
        assert rig.count_logged(*DUPLICATE_MESSAGES) >= 4, "every copy was refused"


async def test_a_poison_tile_is_dead_lettered_and_other_jobs_complete(
    chaos_env: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    env = chaos_env | {"TESSERA_MAX_DELIVER": "3"}
    armed = {"TESSERA_CRASH_AT": "worker.after_lease:1"}
    async with open_rig(env, tmp_path / "logs", start=False) as rig:
        for name in ("gateway", "scheduler", "finalizer"):
            rig.procs.start(name)
        rig.procs.start("worker", name="worker-1", env=armed)
        rig.supervisor.sticky["worker-1"] = armed  # every restart dies on its first tile
        rig.supervisor.start()
        poison = await rig.submit(tiny(width=16, height=16, project="poison"))
        status = await rig.settle(poison)
        assert status["state"] == "dead_lettered", status
        assert rig.crash_points_hit() == {"worker.after_lease": 3}
        rig.supervisor.sticky.clear()  # the poison is gone: the next worker is healthy
        rig.procs.kill("worker-1")
        body = tiny()
        healthy = await rig.submit(body)
        await rig.settle(healthy)
        letters = (await rig.client.dlq_list(job_id=poison))["dead_letters"]
        assert [(d["reason"], d["deliveries"]) for d in letters] == [("max_deliveries", 3)]
        assert "lease_expired" in letters[0]["error"], letters[0]
        reports = [
            await check_job(rig, poison, None, expect="dead_lettered", reason="max_deliveries"),
            await check_job(rig, healthy, body),
        ]
        record(summary_row("poison tile (max_deliver 3)", reports, rig,
                           time.monotonic() - started))  # fmt: skip
        for r in reports:
            r.assert_ok()
        assert reports[0].dlq == 1 and reports[0].takeovers == 2


async def test_a_scene_the_kernel_cannot_render_fails_terminally_without_retries(
    chaos_env: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    scene = kernel.builtin_scene("spheres")
    scene["camera"]["up"] = [1e-200, 0, 0]  # validates, but its norm underflows to 0
    body = tiny(scene=scene, project="degenerate")
    # each tile its own message, so each terminal tile is one dead letter (a run of them is one
    # dead letter naming its first terminal tile: tests/worker/test_run_unit.py)
    async with open_rig(chaos_env | {"TESSERA_DISPATCH_RUN": "1"}, tmp_path / "logs") as rig:
        job_id = await rig.submit(body)
        status = await rig.settle(job_id)
        assert status["state"] == "failed_terminal", status
        report = await check_job(rig, job_id, None, expect="failed_terminal",
                                 reason="kernel_failure")  # fmt: skip
        record(summary_row("kernel failure", [report], rig, time.monotonic() - started))
        report.assert_ok()
        attempts = await _tile_attempts(rig, job_id)
        assert attempts and {a.outcome.value for a in attempts if a.outcome} == {"terminal"}
        assert report.retries == 0 and report.takeovers == 0 and report.dlq == len(attempts)
        assert "non-finite camera" in (status["last_error"] or "")


async def test_a_worker_killed_holding_a_late_copys_lease_settles_the_copy_after_restart(
    chaos_env: dict[str, str], tmp_path: Path
) -> None:
    """A copy of a done tile arrives after its committer's lease expired: the worker takes the
    lease, the fence's statement finds the tile done and writes nothing, the copy re-announces
    it, and the worker is SIGKILLed before it gives the lease back
    (``worker.before_copy_release``; reached because the worker's cached job row is still the
    running one). Restarted, the worker reads the job afresh and drops the redelivered copy:
    nothing is rendered or committed twice, the image stands."""
    started = time.monotonic()
    point = "worker.before_copy_release"
    body = tiny()
    async with open_rig(chaos_env, tmp_path / "logs", start=False) as rig:
        for name in ("gateway", "scheduler", "finalizer"):
            rig.procs.start(name)
        rig.procs.start("worker", name="worker-1", env={"TESSERA_CRASH_AT": f"{point}:1"})
        rig.supervisor.start()
        job_id = await rig.submit(body)
        status = await rig.settle(job_id)
        assert status["state"] == "completed", rig.procs.logs()
        assert rig.crash_points_hit() == {}, "no copy met a done tile on the plain path"
        kv = await rig.nc.jetstream().key_value(rig.names.bucket(n.BUCKET_LEASES))
        key = n.lease_key_tile(job_id, 0)

        async def expired() -> bool:
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                return True
            return entry.operation is not None  # a delete or purge marker

        await eventually(expired, timeout=30, what="the committer's lease expired")
        js = rig.nc.jetstream()
        await js.publish(
            rig.names.tile_subject(job_id, 0),
            TileMessage(job_id, 0, generation=7).encode(),
            headers={"Nats-Msg-Id": n.tile_msg_id(job_id, 0, 7)},
        )
        await eventually(
            lambda: ("worker-1", -9) in rig.supervisor.exit_codes,
            timeout=30,
            what="worker-1 died at the point and was restarted",
            detail=rig.procs.logs,
        )
        assert rig.crash_points_hit() == {point: 1}, rig.procs.logs()

        async def drained() -> bool:
            info = await js.stream_info(rig.names.stream(n.STREAM_TILES))
            return info.state.messages == 0

        await eventually(drained, timeout=30, what="the copy is consumed", detail=rig.procs.logs)
        report = await check_job(rig, job_id, body)
        record(summary_row(point, [report], rig, time.monotonic() - started))
        report.assert_ok()
        commits = [e for e in await rig.db.job_events(job_id) if e.to_state == "done"]
        assert len(commits) == len({e.tile_index for e in commits}), "one commit per tile"
        # before the kill the worker's cached job row still said running, so the copy was
        # settled by its tile row; the restarted worker reads the job afresh: completed
        assert rig.count_logged("tile already done") == 1
        assert rig.count_logged("job is final; dropping") >= 1, "the redelivery was dropped"


async def test_a_worker_killed_right_after_a_group_commit_loses_nothing(
    chaos_env: dict[str, str], tmp_path: Path
) -> None:
    """64 tiny tiles, 32 in hand: their commits share statements (group commit). The worker is
    SIGKILLed as the 8th commit returns, so tiles of that statement are committed but never
    announced or acked; their redeliveries find them done. Each tile commits exactly once and
    the image is the reference."""
    started = time.monotonic()
    point = "worker.after_commit"
    body = tiny(width=64, height=64, tile_size=8, spp=1)
    armed = {"TESSERA_CRASH_AT": f"{point}:8"}
    env = chaos_env | {"TESSERA_WORKER_IN_HAND": "32"}
    async with open_rig(env, tmp_path / "logs", start=False) as rig:
        for name in ("gateway", "scheduler", "finalizer"):
            rig.procs.start(name)
        rig.procs.start("worker", name="worker-1", env=armed)
        rig.supervisor.start()
        job_id = await rig.submit(body)
        await rig.settle(job_id)
        await eventually(
            lambda: ("worker-1", -9) in rig.supervisor.exit_codes,
            timeout=10,
            what="worker-1 died at the point and was restarted",
            detail=rig.procs.logs,
        )
        assert rig.crash_points_hit() == {point: 1}, rig.procs.logs()
        report = await check_job(rig, job_id, body)
        record(summary_row("kill after a group commit", [report], rig, time.monotonic() - started))
        report.assert_ok()
        commits = [e for e in await rig.db.job_events(job_id) if e.to_state == "done"]
        tiles = sorted(e.tile_index for e in commits if e.tile_index is not None)
        assert tiles == list(range(64)) and len(commits) == 64, "one commit per tile"
        # rows of one statement share its transaction's clock
        per_statement = Counter(e.at for e in commits)
        assert max(per_statement.values()) >= 2, "commits went together in one statement"
