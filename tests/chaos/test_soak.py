"""Randomised soak: jobs keep arriving while random services are SIGKILLed (some restarted with
a random crash point armed); then everything is restarted and drained, and every job must pass
the shared invariant checker.

Short by default (part of every ``pytest`` run); ``TESSERA_SOAK_SECONDS=<n>`` makes the chaos
phase last ``n`` seconds, ``TESSERA_SOAK_SEED`` replays a run. The table goes to stdout (``-s``)
and to ``soak.txt`` in the test's tmp dir. Duplicates are counted from the workers' logs: a
delivery that found its tile already done, or its lease held by a live owner.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from shared.core import crash
from tests.chaos.invariants import JobReport, check_job
from tests.chaos.rig import DUPLICATE_MESSAGES, Rig, open_rig, tiny
from tests.chaos.table import render_table

CHAOS_SECONDS = float(os.environ.get("TESSERA_SOAK_SECONDS") or 30)
SEED = int(os.environ.get("TESSERA_SOAK_SEED") or time.time_ns() % 1_000_000)

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(CHAOS_SECONDS + 240)]


async def _chaos(
    rig: Rig, rng: random.Random, bodies: list[dict[str, Any]]
) -> tuple[list[str], Counter[str]]:
    """Submit a job and kill something, every 1.5-3 s, for CHAOS_SECONDS: job ids, kills."""
    jobs: list[str] = []
    kills: Counter[str] = Counter()
    deadline = time.monotonic() + CHAOS_SECONDS
    while time.monotonic() < deadline:
        body = tiny(frame=len(bodies), spp=rng.choice((200, 1000, 3000)))
        bodies.append(body)
        jobs.append(await rig.submit(body))
        names = sorted(rig.procs.procs)
        name = rng.choice(names + [m for m in names if m.startswith("worker")])  # workers 2x
        if rig.procs.procs[name].alive():
            service = name.split("-")[0]
            points = sorted(p for p in crash.POINTS if p.startswith(f"{service}."))
            if points and rng.random() < 0.3:  # its restart dies again at a random point
                point = f"{rng.choice(points)}:{rng.randint(1, 3)}"
                rig.supervisor.once[name] = {"TESSERA_CRASH_AT": point}
            await asyncio.to_thread(rig.procs.kill, name)
            kills[service] += 1
        await asyncio.sleep(rng.uniform(1.5, 3.0))  # the chaos schedule, not a synchronisation
    return jobs, kills


async def test_soak(chaos_env: dict[str, str], tmp_path: Path) -> None:
    print(f"\nsoak: seed {SEED}, chaos for {CHAOS_SECONDS:g} s (TESSERA_SOAK_SEED={SEED})")
    rng = random.Random(SEED)
    started = time.monotonic()
    bodies: list[dict[str, Any]] = []
    env = chaos_env | {"TESSERA_CHECKPOINT_INTERVAL": "0.05"}  # a kill mid-tile can resume
    async with open_rig(env, tmp_path / "logs", workers=2) as rig:
        rig.supervisor.max_restarts = 1000
        jobs, kills = await _chaos(rig, rng, bodies)
        rig.supervisor.once.clear()  # drain: whatever dies now comes back clean
        chaos_done = time.monotonic()
        statuses = [await rig.settle(j, timeout=90) for j in jobs]
        reports: list[JobReport] = []
        for job_id, body in zip(jobs, bodies, strict=True):
            reports.append(await check_job(rig, job_id, body))
        table = _table(rig, kills, reports, statuses, started, chaos_done)
    print(table)
    (tmp_path / "soak.txt").write_text(table + "\n")
    violations = [f"{r.job_id}: {v}" for r in reports for v in r.violations]
    assert not violations, "\n".join(violations)


def _table(
    rig: Rig,
    kills: Counter[str],
    reports: list[JobReport],
    statuses: list[dict[str, Any]],
    started: float,
    chaos_done: float,
) -> str:
    states = Counter(s["state"] for s in statuses)
    fired = rig.crash_points_hit()
    rows = [
        ("seed", SEED),
        ("jobs", f"{len(reports)} ({', '.join(f'{k} {v}' for k, v in sorted(states.items()))})"),
        ("kills by service", ", ".join(f"{k} {v}" for k, v in sorted(kills.items())) or "0"),
        ("crash points fired", ", ".join(f"{k} {v}" for k, v in sorted(fired.items())) or "0"),
        ("restarts (supervisor)", sum(rig.supervisor.restarts.values())),
        ("duplicates suppressed (worker logs)", rig.count_logged(*DUPLICATE_MESSAGES)),
        ("resumes (attempts resumed_from > 0)", sum(r.resumes for r in reports)),
        ("takeovers", sum(r.takeovers for r in reports)),
        ("retries (attempts ended retryable)", sum(r.retries for r in reports)),
        ("DLQ entries", sum(r.dlq for r in reports)),
        ("invariant violations", sum(len(r.violations) for r in reports)),
        (
            "chaos / drain seconds",
            f"{chaos_done - started:.1f} / {time.monotonic() - chaos_done:.1f}",
        ),
    ]
    return render_table(("metric", "value"), [{"metric": k, "value": v} for k, v in rows])
