"""Pause-latency benchmark (issue 16 (c); not a test): pause request -> all leases released.

Run: ``python -m bench.scheduling_pause``. On the embedded stack (NATS, PostgreSQL, directory
object store) with the four services as separate processes: a job of long tiles is submitted,
and once every kernel thread renders one of its tiles it is paused; the clock runs from the
pause request until the lease KV holds no lease of any of its tiles (read from the bucket's
stream, as ``tessera top`` does). Target: at most one pass (``TESSERA_PASS_SECONDS``) + 1 s.
Each round resumes the job and pauses it again once its tiles are back in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from bench.pipeline import with_services
from proto import names as n
from proto.api import SubmitRequest
from services.cli.ops.top import lease_of
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.devstack.stack import Stack
from shared.metadata import MetadataStore
from shared.nats.jetstream import connect_nats

__all__ = ["measure_pause", "pause_latencies", "report"]

_POLL = 0.005


async def measure_pause(env: Mapping[str, str], *, rounds: int, in_flight: int) -> list[float]:
    """Seconds from each pause request to the last of the job's leases released."""
    settings = Settings.from_env(env)
    nc = await connect_nats(settings, name="bench-pause")
    db = await MetadataStore.connect(settings.database_url)
    names = n.Names(settings.deployment.namespace)
    bucket, js = names.bucket(n.BUCKET_LEASES), nc.jetstream()
    try:
        client = TesseraClient(nc, names, timeout=60)
        req = SubmitRequest(project="bench", scene="cornell", width=64, height=64, spp=60000,
                            tile_size=16)  # fmt: skip
        job_id = (await client.submit(req))["job_id"]
        tiles = (req.width // 16) * (req.height // 16)
        keys = [n.lease_key_tile(job_id, i) for i in range(tiles)]
        seconds = []
        for _ in range(rounds):
            while True:  # every kernel thread busy with a tile of the job, checkpointed once
                busy = [t for t in await db.list_tiles(job_id)
                        if t.state.value == "progressing" and t.samples_done > 0]  # fmt: skip
                if len(busy) >= in_flight:
                    break
                await asyncio.sleep(0.05)
            asked = time.monotonic()
            await client.pause(job_id)
            while any([await lease_of(js, bucket, k) for k in keys]):  # noqa: ASYNC110
                await asyncio.sleep(_POLL)  # polling the KV is what is measured
            seconds.append(time.monotonic() - asked)
            await client.resume(job_id)
        await client.cancel(job_id)
        return seconds
    finally:
        await db.close()
        await nc.close()


def pause_latencies(stack: Stack, *, rounds: int = 5, pass_seconds: float = 1.0,
                    slots: int = 2) -> list[float]:  # fmt: skip
    """(c) on ``stack``: the four services started with one worker of ``slots`` kernel threads
    and passes of ``pass_seconds``, then ``rounds`` pauses measured; the services stopped."""
    env = {
        "TESSERA_NAMESPACE": "benchPause",
        "TESSERA_PASS_SECONDS": str(pass_seconds),
        "TESSERA_WORKER_SLOTS": str(slots),
        "TESSERA_CHECKPOINT_INTERVAL": "30",
    }
    procs = with_services(stack, env, workers=1)
    try:
        return asyncio.run(measure_pause(stack.env() | env, rounds=rounds, in_flight=slots))
    finally:
        procs.stop_all()


def report(seconds: list[float], *, pass_seconds: float, slots: int) -> str:
    """The figure's lines, with the target."""
    target = pass_seconds + 1.0
    return (
        f"(c) pause latency, request -> all leases released, {len(seconds)} pauses, "
        f"{slots} tiles in flight, pass {pass_seconds:g} s:\n"
        "    " + ", ".join(f"{s:.3f}" for s in seconds) + " s\n"
        f"    median {statistics.median(seconds):.3f} s, max {max(seconds):.3f} s; "
        f"target <= one pass + 1 s = {target:g} s: "
        f"{'met' if max(seconds) <= target else 'MISSED'}"
    )


def main() -> None:
    """Measure and print the pause latency against its target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="pauses measured")
    parser.add_argument("--pass-seconds", type=float, default=1.0, help="TESSERA_PASS_SECONDS")
    parser.add_argument("--slots", type=int, default=2, help="kernel threads of the worker")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp,
        Stack(Path(tmp), durable=False) as stack,
    ):
        seconds = pause_latencies(
            stack, rounds=args.rounds, pass_seconds=args.pass_seconds, slots=args.slots
        )
    print(report(seconds, pass_seconds=args.pass_seconds, slots=args.slots))


if __name__ == "__main__":
    main()
