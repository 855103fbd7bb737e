"""Every named crash point, one SIGKILL each: the job still ends with the reference PNG.

The armed service dies at the point (its log shows the point's line and its exit is SIGKILL),
the supervisor restarts it without the crash variable, and redelivery (after ``ack_wait``)
finishes the job. Tiny renders; FAST timings (lease TTL 2 s, ack_wait 4 s).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from shared.core import crash
from tests.chaos.conftest import record
from tests.chaos.invariants import check_job, summary_row
from tests.chaos.rig import open_rig, tiny
from tests.helpers import eventually

pytestmark = pytest.mark.chaos

#: pixels of one of the tiny job's tiles (16x16)
TINY_TILE_PIXELS = 16 * 16

#: point -> (nth arrival, extra env for every service, request overrides)
CASES: dict[str, tuple[int, dict[str, str], dict[str, Any]]] = {
    "worker.before_lease": (1, {}, {}),
    "worker.after_lease": (1, {}, {}),
    # a checkpoint after every pass, so the third comes well before any tile is done
    "worker.after_checkpoint": (3, {"TESSERA_CHECKPOINT_INTERVAL": "0"}, {"spp": 40}),
    # a new checkpoint is written but the pointer still names the previous one: the resume
    # must load exactly the samples the pointer records (every checkpoint has its own key).
    # The 9th checkpoint: a worker holds several tiles, so the first ones are each tile's first.
    # Passes of a fixed size (not grown to TESSERA_PASS_SECONDS), so every tile has many.
    "worker.before_pointer": (
        9,
        {"TESSERA_CHECKPOINT_INTERVAL": "0", "TESSERA_PASS_SECONDS": "0"},
        {"spp": 40},
    ),
    # renews every 50 ms; a tile of 800 spp lasts several of them
    "worker.during_renew": (1, {"TESSERA_HEARTBEAT_INTERVAL": "0.05"}, {"spp": 800}),
    "worker.after_result_write": (1, {}, {}),
    "worker.after_commit": (1, {}, {}),
    "worker.before_ack": (1, {}, {}),
    # the first tile acked without its completion question while another tile of the job was
    # owned in the worker: that one's unacked message comes back and its commit asks
    "worker.after_deferred_ack": (1, {}, {}),
    # the tiny job's 4 tiles in one message (a run): every tile settled, the message not
    "worker.before_run_settle": (1, {"TESSERA_DISPATCH_RUN_WORK": "65536"}, {}),
    # the tiny job's 4 tiles in one run, every result written and none committed (the commits
    # wait for the run's last render, the results for its one write): the redelivered run
    # renders all four again. Results as objects (the tiny job's would go inline), so the kill
    # follows the run's one write of four files.
    "worker.after_run_rendered": (
        1,
        {"TESSERA_DISPATCH_RUN_WORK": "65536", "TESSERA_INLINE_RESULT_BYTES": "0"},
        {},
    ),
    # the tiny job widened to 6 tiles of 64 spp (long enough that the first two runs are still
    # rendering when the third arrives), in three runs of two, on one kernel thread (two turns)
    # holding three messages (a window of three a thread): the third run waits in hand for a
    # turn, nothing of it started; all come back
    "worker.run_waiting": (
        1,
        {
            "TESSERA_DISPATCH_RUN_WORK": str(2 * TINY_TILE_PIXELS * 64),
            "TESSERA_DISPATCH_FACTOR": "3",
            "TESSERA_WORKER_SLOTS": "1",
            "TESSERA_WORKER_IN_HAND": "3",
        },
        {"width": 48, "spp": 64},
    ),
    # reached once per job, by the commit that completes it: the unacked message comes back,
    # finds the tile done and announces the completion (nothing else would finalize the job)
    "worker.before_tiles_done": (1, {}, {}),
    "finalizer.after_finalizing": (1, {}, {}),
    "finalizer.after_image_write": (1, {}, {}),
    "finalizer.after_complete": (1, {}, {}),
    "scheduler.after_plan": (1, {}, {}),
    # released (rows stamped) but nothing published / half published: the sweeper re-publishes
    "scheduler.after_release": (1, {}, {}),
    "scheduler.mid_publish": (1, {}, {}),
}


#: points inside a renderer pass: the full-stack scenario (a worker SIGKILLed there while its
#: Blender renders leaves no Blender behind, a second worker finishes the tile bit-identically)
#: lives with the renderer tests, which need the real ``blender`` binary and a scene asset
RENDERER_CASES = {
    "worker.blender_mid_pass": "tests/renderers/test_stack.py::"
    "test_a_worker_sigkilled_inside_a_blender_pass_leaves_no_blender",
    # points on the pause path: reached only when a job is paused mid-tile; the scenario (a
    # worker SIGKILLed there, a second one hands the tile back, resumed it continues from the
    # pause checkpoint, the image bit-identical) is parametrised over both points
    "worker.after_pause_checkpoint": "tests/e2e/test_pause.py::"
    "test_a_worker_killed_while_its_tile_pauses_loses_nothing",
    "worker.before_unrelease": "tests/e2e/test_pause.py::"
    "test_a_worker_killed_while_its_tile_pauses_loses_nothing",
    # reached only by a copy of a done tile arriving after its committer's lease expired: the
    # scenario sends such a copy to a worker armed there
    "worker.before_copy_release": "tests/chaos/test_scenarios.py::"
    "test_a_worker_killed_holding_a_late_copys_lease_settles_the_copy_after_restart",
}


def test_every_point_has_a_scenario() -> None:
    assert set(CASES) | set(RENDERER_CASES) == crash.POINTS
    root = Path(__file__).resolve().parents[2]
    for point, node in RENDERER_CASES.items():
        path, _, test = node.partition("::")
        source = (root / path).read_text()
        assert f"def {test}(" in source and point in source, f"{point}: {node} is not there"


#: points of a tile's own steps, reached again with the tiny job's 4 tiles in one message (a
#: run): the first tile to get there kills the worker while the other three are mid-way (at
#: ``worker.after_commit``: committed with it, the run's commits going together), and the
#: redelivered run renders what is not done; its results are objects (the tiny job's would go
#: inline), written in the run's one call
RUN_POINTS = ("worker.after_lease", "worker.after_result_write", "worker.after_commit",
              "worker.before_ack")  # fmt: skip
RUN_ENV = {"TESSERA_DISPATCH_RUN_WORK": "65536", "TESSERA_INLINE_RESULT_BYTES": "0"}
RUN_CASES = {
    point: (nth, extra | RUN_ENV, overrides)
    for point, (nth, extra, overrides) in CASES.items()
    if point in RUN_POINTS
}


@pytest.mark.parametrize(
    ("point", "case"),
    [*((p, CASES[p]) for p in sorted(CASES)), *((p, RUN_CASES[p]) for p in sorted(RUN_CASES))],
    ids=[*sorted(CASES), *(f"{p}-in-a-run" for p in sorted(RUN_CASES))],
)
async def test_crash_point(
    point: str,
    case: tuple[int, dict[str, str], dict[str, Any]],
    chaos_env: dict[str, str],
    tmp_path: Path,
) -> None:
    nth, extra, overrides = case
    if "TESSERA_DISPATCH_RUN_WORK" not in extra:
        # each of the tiny job's tiles its own message (the default puts its 4 short tiles in
        # one run, which RUN_CASES and worker.before_run_settle exercise)
        extra = {"TESSERA_DISPATCH_RUN": "1"} | extra
    body = tiny(**overrides)
    armed = {"TESSERA_CRASH_AT": f"{point}:{nth}"}
    service = point.split(".")[0]
    started = time.monotonic()
    async with open_rig(chaos_env | extra, tmp_path / "logs", start=False) as rig:
        for name in ("gateway", "scheduler", "finalizer"):
            rig.procs.start(name, env=armed if name == service else None)
        rig.procs.start("worker", name="worker-1", env=armed if service == "worker" else None)
        rig.supervisor.start()
        # every TILES publish, seen by a plain subscriber (the run cases' evidence: a worker
        # killed at the run's first commit may log none of its tiles, CI 2026-12-06)
        published: list[str] = []

        async def seen(msg: Msg) -> None:
            published.append(msg.subject)

        watch = await rig.nc.subscribe(rig.names.tiles_subjects, cb=seen)
        await rig.nc.flush()
        job_id = await rig.submit(body)
        await rig.settle(job_id)
        victim = "worker-1" if service == "worker" else service
        # a point after the job's last write may fire just after the job looks settled
        await eventually(
            lambda: (victim, -9) in rig.supervisor.exit_codes,
            timeout=10,
            what=f"{victim} died by SIGKILL and was restarted",
            detail=rig.procs.logs,
        )
        assert rig.crash_points_hit() == {point: 1}, rig.procs.logs()
        report = await check_job(rig, job_id, body)
        record(summary_row(point, [report], rig, time.monotonic() - started))
        report.assert_ok()
        if point in ("worker.after_checkpoint", "worker.before_pointer"):
            assert report.resumes >= 1, "a tile with a checkpoint resumed from it"
        await watch.unsubscribe()
        if "TESSERA_DISPATCH_RUN_WORK" in extra:
            length = int(extra["TESSERA_DISPATCH_RUN_WORK"]) // (TINY_TILE_PIXELS * body["spp"])
            run = rig.names.tile_subject(job_id, 0, run=min(length, 4))
            assert published[:1] == [run], f"the job's first tiles went out as a run: {published}"
            runs = {line.get("run") for line in rig.log_lines("worker") if "run" in line}
            assert runs <= {min(length, 4)}, "every line of a run's tile names its run"
