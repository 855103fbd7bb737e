"""Scheduling benchmark (not a test): fair share, priority latency, dispatch throughput.

Run: ``python -m bench.scheduling`` (``--seconds 30`` for a short run). On the embedded stack
(NATS, PostgreSQL, directory object store), the four services as separate processes:

(a) two projects with weights 2:1 submitting continuous work to 2 workers for ``--seconds``
    (default 120): each project's kernel core-seconds over the run (from ``attempts``), and
    their ratio; target within +-10 % of 2:1;
(b) a priority-90 job submitted behind 500 released-or-queued tiles of priority-50 jobs: time
    from its submit (``jobs.created_at``) to its first leased tile (its first attempt's
    ``started_at``), against one tile duration (median attempt of the priority-50 tiles) plus one
    dispatch interval;
(c) pause latency, request to all of the job's leases released, against one pass + 1 s:
    :func:`bench.scheduling_pause.pause_latencies` (also runnable alone,
    ``python -m bench.scheduling_pause``);
(d) the tiny-tile throughput of ``bench/pipeline.py`` (b) with dispatch on (this tree) against
    the tree before dispatch (``--before DIR``, a ``git worktree add DIR 40d288f``), run one after
    the other in this run, ``--rounds`` pairs (alternating which goes first; each pair's ratio
    printed as it ends, then the medians); target at most 10 % below.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import asyncpg

from bench.counters import service_env
from bench.scheduling_pause import pause_latencies, report
from proto.api import SubmitRequest
from proto.names import Names
from services.cli.local import ServiceProcesses
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.devstack.stack import Stack
from shared.metadata import MetadataStore
from shared.nats.jetstream import connect_nats

REPO = Path(__file__).resolve().parents[1]
TERMINAL = ("completed", "failed_terminal", "dead_lettered", "cancelled")


def _procs(stack: Stack, env: Mapping[str, str], workers: int) -> ServiceProcesses:
    procs = ServiceProcesses(stack.env() | service_env() | dict(env), stack.data_dir / "logs")
    procs.start_all(workers=workers)
    return procs


def _request(project: str, seed: int, **over: Any) -> SubmitRequest:
    fields: dict[str, Any] = {"project": project, "scene": "cornell", "width": 128,
                              "height": 128, "spp": 512, "tile_size": 32, "seed": seed}  # fmt: skip
    fields |= over
    return SubmitRequest(**fields)


async def _open(env: Mapping[str, str]) -> tuple[Any, TesseraClient, asyncpg.Connection]:
    settings = Settings.from_env(env)
    nc = await connect_nats(settings, name="bench-scheduling")
    client = TesseraClient(nc, Names(settings.deployment.namespace), timeout=60)
    store = await MetadataStore.connect(settings.database_url)  # the schema, if not yet there
    await store.close()
    conn = await asyncpg.connect(settings.database_url)
    return nc, client, conn


async def _submit(client: TesseraClient, conn: asyncpg.Connection, req: SubmitRequest,
                  priority: int | None = None) -> str:  # fmt: skip
    """Submit, with ``priority`` when given (the dispatcher decides at release time)."""
    if priority is not None:
        req = dataclasses.replace(req, priority=priority)
    return str((await client.submit(req))["job_id"])


_CORE_SECONDS = """
    SELECT j.project, sum(extract(epoch FROM LEAST(COALESCE(a.ended_at, now()), $2)
                                  - GREATEST(a.started_at, $1))) AS seconds
    FROM attempts a JOIN jobs j ON j.job_id = a.job_id
    WHERE a.kind = 'tile' AND a.started_at < $2 AND COALESCE(a.ended_at, now()) > $1
    GROUP BY j.project
"""


async def _fair_share(env: Mapping[str, str], seconds: float) -> dict[str, float]:
    """(a): keep both projects busy for ``seconds``; their core-seconds in that time."""
    nc, client, conn = await _open(env)
    try:
        await conn.execute(
            "INSERT INTO projects (name, weight) VALUES ('alpha', 2), ('beta', 1) "
            "ON CONFLICT (name) DO UPDATE SET weight = EXCLUDED.weight"
        )
        live: dict[str, list[str]] = {"alpha": [], "beta": []}
        seed = 0
        start = await conn.fetchval("SELECT now()")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for project, jobs in live.items():
                states = {r["job_id"]: r["state"] for r in await conn.fetch(
                    "SELECT job_id, state FROM jobs WHERE job_id = ANY($1)", jobs)}  # fmt: skip
                jobs[:] = [j for j in jobs if states.get(j) not in TERMINAL]
                while len(jobs) < 3:  # three 16-tile jobs waiting each: never starved
                    seed += 1
                    jobs.append(await _submit(client, conn, _request(project, seed)))
            await asyncio.sleep(0.5)
        end = await conn.fetchval("SELECT now()")
        rows = await conn.fetch(_CORE_SECONDS, start, end)
        for jobs in live.values():
            for job_id in jobs:
                await client.cancel(job_id)
        return {r["project"]: float(r["seconds"]) for r in rows}
    finally:
        await conn.close()
        await nc.close()


async def _priority(env: Mapping[str, str], backlog: int) -> tuple[float, float]:
    """(b): seconds from the priority-90 submit to its first lease; median tile seconds."""
    nc, client, conn = await _open(env)
    try:
        jobs = []
        for seed in range(-(-backlog // 16)):  # 16-tile jobs of priority 50
            jobs.append(await _submit(client, conn, _request("batch", 1000 + seed), 50))
        started = "SELECT count(*) >= 4 FROM attempts WHERE job_id = ANY($1)"
        await _until(lambda: conn.fetchval(started, jobs))  # the workers are on the backlog
        urgent = await _submit(client, conn, _request("urgent", 99, width=64, height=64), 90)
        first = await _until(
            lambda: conn.fetchval(
                "SELECT extract(epoch FROM min(a.started_at) - j.created_at) FROM attempts a "
                "JOIN jobs j ON j.job_id = a.job_id WHERE a.job_id = $1 GROUP BY j.created_at",
                urgent,
            )
        )
        tile = await conn.fetchval(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM "
            "ended_at - started_at)) FROM attempts WHERE job_id = ANY($1) AND outcome = 'done'",
            jobs,
        )
        for job_id in [*jobs, urgent]:
            status = await client.status(job_id)
            if status["state"] not in TERMINAL:
                await client.cancel(job_id)
        return float(first), float(tile or 0.0)
    finally:
        await conn.close()
        await nc.close()


async def _until(probe: Callable[[], Awaitable[Any]], within: float = 300.0) -> Any:
    """``probe()``'s first truthy value, polled every 20 ms for at most ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await probe()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise TimeoutError(f"not reached within {within} s")


def bench_fair_share(stack: Stack, seconds: float) -> dict[str, float]:
    env = {"TESSERA_NAMESPACE": "benchSA", "TESSERA_WORKER_SLOTS": "1"}
    procs = _procs(stack, env, workers=2)
    try:
        return asyncio.run(_fair_share(stack.env() | env, seconds))
    finally:
        procs.stop_all()


def bench_priority(stack: Stack, backlog: int) -> tuple[float, float, float]:
    interval = Settings.from_env(stack.env()).scheduler.dispatch_interval
    env = {"TESSERA_NAMESPACE": "benchSB", "TESSERA_WORKER_SLOTS": "1"}
    procs = _procs(stack, env, workers=2)
    try:
        first, tile = asyncio.run(_priority(stack.env() | env, backlog))
    finally:
        procs.stop_all()
    return first, tile, interval


_TILES_PER_S = re.compile(r"\(b\)\s+tiles/s, (\d+) worker process\(es\)\s+([\d.]+)")


def tiny_tiles(tree: Path, side: int) -> dict[int, float]:
    """``workers -> tiles/s`` of ``bench.pipeline`` (b) run from ``tree``."""
    env = dict(os.environ) | {"PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-m", "bench.pipeline", "--skip", "a,a',c", "--tiny-side", str(side)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=1800, check=True,
    ).stdout  # fmt: skip
    return {int(w): float(v) for w, v in _TILES_PER_S.findall(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="(a): length of the run")
    parser.add_argument("--backlog", type=int, default=500, help="(b): priority-50 tiles")
    parser.add_argument("--before", type=Path, help="(d): a worktree of the tree before dispatch")
    parser.add_argument("--tiny-side", type=int, default=32, help="(d): side^2 tiny tiles")
    parser.add_argument("--rounds", type=int, default=1, help="(d): interleaved rounds")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c,d")
    args = parser.parse_args()
    skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tessera-sched-") as tmp, Stack(Path(tmp)) as stack:
        if "a" not in skip:
            shares = bench_fair_share(stack, args.seconds)
            a, b = shares.get("alpha", 0.0), shares.get("beta", 0.0)
            ratio = a / b if b else float("inf")
            summary.append(
                f"(a) weights 2:1, 2 workers, {args.seconds:g} s: alpha {a:.1f} core-s, beta "
                f"{b:.1f} core-s, ratio {ratio:.2f} (share {a / (a + b):.1%} : "
                f"{b / (a + b):.1%}); target 2.00 +-10 %"
            )
            print(summary[-1], flush=True)
        if "b" not in skip:
            first, tile, interval = bench_priority(stack, args.backlog)
            summary.append(
                f"(b) priority 90 behind {args.backlog} priority-50 tiles: first lease after "
                f"{first:.3f} s; one tile {tile:.3f} s + one interval {interval:g} s = "
                f"{tile + interval:.3f} s"
            )
            print(summary[-1], flush=True)
        if "c" not in skip:
            seconds = pause_latencies(stack)
            summary.append(report(seconds, pass_seconds=1.0, slots=2))
            print(summary[-1], flush=True)
    if "d" not in skip:
        if args.before is None:
            summary.append("(d) skipped: pass --before DIR (git worktree add DIR 40d288f)")
            print(summary[-1], flush=True)
        else:
            now: list[dict[int, float]] = []
            then: list[dict[int, float]] = []
            for i in range(args.rounds):
                # Pairs alternate which tree goes first: a drift in the box's load (it may be
                # shared) does not always favour the same side.
                if i % 2 == 0:
                    then.append(tiny_tiles(args.before, args.tiny_side))
                    now.append(tiny_tiles(REPO, args.tiny_side))
                else:
                    now.append(tiny_tiles(REPO, args.tiny_side))
                    then.append(tiny_tiles(args.before, args.tiny_side))
                pairs = ", ".join(
                    f"{w} worker(s) {now[-1][w]:.0f}/{then[-1][w]:.0f} = "
                    f"{now[-1][w] / then[-1][w]:.3f}"
                    for w in sorted(now[-1])
                )
                print(f"(d) pair {i + 1}, dispatch/before tiles/s: {pairs}", flush=True)
            for workers in sorted(now[0]):
                new = statistics.median(r[workers] for r in now)
                old = statistics.median(r[workers] for r in then)
                ratios = statistics.median(
                    r[workers] / b[workers] for r, b in zip(now, then, strict=True)
                )
                summary.append(
                    f"(d) tiny tiles, {workers} worker(s): dispatch {new:.0f} tiles/s, before "
                    f"{old:.0f} tiles/s, ratio of medians {new / old:.3f}, median pair ratio "
                    f"{ratios:.3f} (target >= 0.90)"
                )
                print(summary[-1], flush=True)
    print("\nsummary\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
