"""Pipeline benchmark (not a test): overhead, tiny-tile throughput, crash-to-resume time.

Run: ``python -m bench.pipeline`` (``make bench``). Everything is measured side by side in one
run on this machine, on the embedded stack (NATS, PostgreSQL, directory object store), with the
four services as separate processes and every guarantee on (leases, fencing, checkpoints,
``ack_sync``):

(a) a 512x512, 64 spp cornell job with 64x64 tiles end to end, vs the same image rendered directly
    by the kernel on the same cores (``render_full(parallel=True)``): overhead target <= 3 %;
(b) tiny tiles (8x8, 1 spp) through all four services: tiles/s, target >= 500 on 2 cores;
(c) a worker SIGKILLed mid-tile: seconds until the tile resumes on another worker and samples
    lost, targets <= lease TTL + 2 s and <= one checkpoint interval's worth.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from nats.aio.msg import Msg

import kernel
from proto.api import SubmitRequest
from proto.names import EventKind, Names
from services.client.api import TesseraClient
from services.local import ServiceProcesses
from shared.config import Settings
from shared.jetstream import connect_nats
from shared.metadata import MetadataStore
from shared.stack import Stack
from shared.tiles import plan_rects, zeros_for

CORES = os.cpu_count() or 1


def direct_render_seconds(
    width: int, height: int, spp: int, tile: int, seed: int = 0
) -> tuple[float, str]:
    """Best wall time of the kernel alone on every core (JIT warmed first), and how.

    Two direct ways are timed and the faster one is the baseline: the kernel's parallel
    full-frame variant (numba ``prange`` over rows), and one thread per core rendering the same
    tiles with ``render_tile`` (what a worker does, without the queue).
    """
    settings = kernel.RenderSettings(width=width, height=height, spp=spp, seed=seed)
    prepared = kernel.prepare(kernel.builtin_scene("cornell"), 0, settings)
    kernel.render_full(prepared, 0, 1, np.zeros((height, width, 3)), parallel=True)
    start = time.perf_counter()
    kernel.render_full(prepared, 0, spp, np.zeros((height, width, 3)), parallel=True)
    parallel = time.perf_counter() - start
    rects = plan_rects(width, height, tile)
    accs = [zeros_for(r) for r in rects]
    with ThreadPoolExecutor(CORES) as pool:
        list(pool.map(lambda i: kernel.render_tile(prepared, rects[i], 0, 1, zeros_for(rects[i])),
                      range(CORES)))  # fmt: skip
        start = time.perf_counter()
        list(pool.map(lambda i: kernel.render_tile(prepared, rects[i], 0, spp, accs[i]),
                      range(len(rects))))  # fmt: skip
        threaded = time.perf_counter() - start
    if parallel <= threaded:
        return (
            parallel,
            f"render_full(parallel) {parallel:.3f} s, tiles on threads {threaded:.3f} s",
        )
    return threaded, f"tiles on {CORES} threads {threaded:.3f} s, render_full {parallel:.3f} s"


async def _wait_state(client: TesseraClient, job_id: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        status = await client.status(job_id)
        if status["state"] in ("completed", "failed_terminal", "dead_lettered", "cancelled"):
            return status
        await asyncio.sleep(0.02)
    raise TimeoutError(f"job {job_id} did not finish within {within} s")


async def timed_job(env: Mapping[str, str], request: SubmitRequest) -> tuple[float, dict[str, Any]]:
    """Submit one job and time it until its job-completed event (the gateway is warm).

    The clock stops on the event, not on polling: a status poll every few milliseconds would
    itself take CPU from the renderers it measures.
    """
    settings = Settings.from_env(env)
    names = Names(settings.deployment.namespace)
    nc = await connect_nats(settings, name="bench")
    try:
        client = TesseraClient(nc, names, timeout=60)
        done = asyncio.Event()

        async def on_event(msg: Msg) -> None:
            done.set()

        sub = await nc.subscribe(names.event_filter(EventKind.JOB_COMPLETED), cb=on_event)
        start = time.perf_counter()
        reply = await client.submit(request)
        await asyncio.wait_for(done.wait(), 600)
        seconds = time.perf_counter() - start
        await sub.unsubscribe()
        return seconds, await client.status(reply["job_id"])
    finally:
        await nc.close()


def with_services(stack: Stack, env: Mapping[str, str], workers: int) -> ServiceProcesses:
    procs = ServiceProcesses(stack.env() | dict(env), stack.data_dir / "logs")
    procs.start_all(workers=workers)
    return procs


def bench_overhead(stack: Stack, spp: int, rounds: int) -> tuple[list[float], list[float]]:
    """(a): pipeline seconds vs direct seconds for the same 512x512 image, ``rounds`` times.

    The two are interleaved (direct, pipeline, direct, ...) so that a slow spell of this
    shared machine weighs on both alike.
    """
    env = {"TESSERA_NAMESPACE": "benchA", "TESSERA_WORKER_SLOTS": str(CORES)}
    procs = with_services(stack, env, workers=1)
    directs, pipelines = [], []
    try:
        warmup = SubmitRequest(project="bench", scene="cornell", width=64, height=64, spp=1)
        asyncio.run(timed_job(stack.env() | env, warmup))  # processes up, JIT cache loaded
        for i in range(rounds):
            direct, how = direct_render_seconds(512, 512, spp, 64, seed=i)
            print(f"    round {i + 1}: direct: {how}")
            req = SubmitRequest(project="bench", scene="cornell", width=512, height=512,
                                spp=spp, tile_size=64, seed=i)  # fmt: skip
            seconds, status = asyncio.run(timed_job(stack.env() | env, req))
            assert status["state"] == "completed", status
            print(f"    round {i + 1}: pipeline {seconds:.3f} s")
            directs.append(direct)
            pipelines.append(seconds)
    finally:
        procs.stop_all()
    return pipelines, directs


def bench_tiny_tiles(stack: Stack, tiles_side: int, workers: int) -> tuple[int, float]:
    """(b): tiles/s for a job of tiles_side^2 8x8 tiles at 1 spp on ``workers`` processes."""
    # 64 tiles in hand in all: each worker holds twice its kernel threads
    env = {"TESSERA_NAMESPACE": f"benchB{workers}", "TESSERA_WORKER_SLOTS": str(32 // workers)}
    procs = with_services(stack, env, workers=workers)
    try:
        project = env["TESSERA_NAMESPACE"]  # one database for every run: keep their keys apart
        warm = SubmitRequest(project=project, scene="cornell", width=64, height=64, spp=1,
                             tile_size=8)  # fmt: skip
        asyncio.run(timed_job(stack.env() | env, warm))
        side = 8 * tiles_side
        req = SubmitRequest(project=project, scene="cornell", width=side, height=side, spp=1,
                            tile_size=8, seed=1)  # fmt: skip
        seconds, status = asyncio.run(timed_job(stack.env() | env, req))
        assert status["state"] == "completed", status
    finally:
        procs.stop_all()
    return tiles_side * tiles_side, seconds


async def _crash_resume(env: Mapping[str, str], procs: ServiceProcesses) -> dict[str, float]:
    settings = Settings.from_env(env)
    nc = await connect_nats(settings, name="bench")
    db = await MetadataStore.connect(settings.database_url)
    try:
        client = TesseraClient(nc, Names(settings.deployment.namespace), timeout=60)
        req = SubmitRequest(project="bench", scene="cornell", width=32, height=32, spp=6000,
                            tile_size=32)  # fmt: skip
        job_id = (await client.submit(req))["job_id"]
        while True:  # wait for the first checkpoint plus a little more progress
            tile = await db.get_tile(job_id, 0)
            if tile is not None and tile.samples_done > 0:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(settings.worker.checkpoint_interval / 2)
        owner = next(a for a in await db.attempts(job_id) if a.ended_at is None).node
        checkpointed = (await db.get_tile(job_id, 0)).samples_done  # type: ignore[union-attr]
        killed_at = time.time()
        procs.kill(owner)
        while True:
            resumed = [a for a in await db.attempts(job_id) if a.node != owner]
            if resumed:
                break
            await asyncio.sleep(0.01)
        status = await _wait_state(client, job_id, within=300)
        assert status["state"] == "completed", status
        attempt = resumed[0]
        return {
            "resume_seconds": attempt.started_at.timestamp() - killed_at,
            "resumed_from": attempt.resumed_from,
            "checkpointed": checkpointed,
            "spp": req.spp,
        }
    finally:
        await db.close()
        await nc.close()


def bench_crash_resume(stack: Stack, ttl: int, checkpoint: float) -> dict[str, float]:
    """(c): SIGKILL the worker rendering a long tile; time until another resumes it."""
    env = {
        "TESSERA_NAMESPACE": "benchC",
        "TESSERA_LEASE_TTL": str(ttl),
        "TESSERA_HEARTBEAT_INTERVAL": str(ttl / 4),
        "TESSERA_ACK_WAIT": str(ttl + 2),
        "TESSERA_CHECKPOINT_INTERVAL": str(checkpoint),
        "TESSERA_WORKER_SLOTS": "1",
    }
    procs = with_services(stack, env, workers=2)
    try:
        return asyncio.run(_crash_resume(stack.env() | env, procs))
    finally:
        procs.stop_all()


def main() -> None:
    """Run the three measurements and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spp", type=int, default=64, help="spp of the overhead job")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of (a)")
    parser.add_argument("--tiny-side", type=int, default=64, help="tiny job: side^2 tiles")
    parser.add_argument("--ttl", type=int, default=4, help="lease TTL for the crash test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp, Stack(Path(tmp)) as stack:
        pipelines, directs = bench_overhead(stack, args.spp, args.rounds)
        best_p, best_d = min(pipelines), min(directs)
        med_p, med_d = statistics.median(pipelines), statistics.median(directs)
        print(f"(a) 512x512 {args.spp} spp, 64x64 tiles, {CORES} cores, {args.rounds} rounds")
        print(f"    best:   direct kernel {best_d:.3f} s   pipeline {best_p:.3f} s   "
              f"ratio {best_p / best_d:.3f}  (overhead {100 * (best_p / best_d - 1):+.1f} %, "
              "target <= +3 %)")  # fmt: skip
        print(f"    median: direct kernel {med_d:.3f} s   pipeline {med_p:.3f} s   "
              f"ratio {med_p / med_d:.3f}  "
              f"(overhead {100 * (med_p / med_d - 1):+.1f} %)")  # fmt: skip
        for workers in (1, CORES):
            tiles, secs = bench_tiny_tiles(stack, args.tiny_side, workers)
            print(f"(b) {tiles} tiles of 8x8 at 1 spp, {workers} worker process(es) holding "
                  f"{64 // workers} tiles each: {secs:.2f} s = {tiles / secs:.0f} tiles/s "
                  "(target >= 500)")  # fmt: skip
        c = bench_crash_resume(stack, args.ttl, 1.0)
        lost = c["checkpointed"] - c["resumed_from"]
        print(f"(c) SIGKILL -> resumed elsewhere in {c['resume_seconds']:.2f} s (lease TTL "
              f"{args.ttl} s, target <= {args.ttl + 2} s); resumed from sample "
              f"{c['resumed_from']:.0f} of {c['spp']:.0f}, {lost:.0f} checkpointed samples "
              "lost (target: <= one checkpoint interval)")  # fmt: skip


if __name__ == "__main__":
    main()
