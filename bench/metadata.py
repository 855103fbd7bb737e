"""Metadata benchmark (not a test): the owner's fence + commit round trips on PostgreSQL.

Run: ``python -m bench.metadata``. On an embedded PostgreSQL (durable, like ``make bench``'s
pipeline; ``--no-fsync`` leaves the disk out), one job of ``--tiles`` tiles is planned and every
tile is fenced and committed the way a worker does it (``fence_first``, which also reads the
row, then ``fence_tile`` where it declined; ``commit_tile`` of an inline result):

(a) one owner after the other: milliseconds per tile (fence + commit) and tiles/s;
(b) ``--owners`` owners at once on the store's pool: tiles/s;
(c) takeovers: every tile fenced again by a newer token, which the transaction owns, then
    committed: milliseconds per tile, for comparison with (a);
(d) dispatch rounds (``release_tiles``) that release one tile each, as the dispatcher does after
    every finished long tile: milliseconds per round.

Rounds are interleaved and the median of each case is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from shared.devstack.stack import PostgresServer
from shared.metadata import MetadataStore, NewJob, TileCommit
from shared.metadata.fastpath import ANY_GENERATION

SIDE, DATA = 16, b"\x93NUMPY" + bytes(200)
"""A 16x16 plan (256 tiles by default) and an inline result about the size of an 8x8 tile's."""


async def _job(db: MetadataStore, tiles: int) -> str:
    request = {"n": uuid.uuid4().hex}
    fingerprint = hashlib.sha256(repr(request).encode()).hexdigest()
    new = NewJob(
        job_id=f"bench-{uuid.uuid4().hex}",
        idempotency_key=uuid.uuid4().hex,
        fingerprint=fingerprint,
        project="bench",
        request=request,
        scene={},
        frame=0,
        input_hash="in-" + fingerprint[:16],
        width=8 * tiles,
        height=8,
        spp=1,
        tile_size=8,
    )
    job_id = (await db.submit_job(new)).job.job_id
    await db.plan_tiles(job_id, [(8 * i, 0, 8 * i + 8, 8) for i in range(tiles)], node="bench")
    return job_id


async def _owner(db: MetadataStore, job_id: str, indexes: range, token: int) -> None:
    for i in indexes:
        attempt = f"{job_id}-{i}-{token}"
        first = await db.fence_first(
            job_id, i, token=token, attempt_id=attempt, node="bench", generation=ANY_GENERATION
        )
        fenced = first.fenced or await db.fence_tile(
            job_id, i, token=token, attempt_id=attempt, node="bench"
        )
        assert fenced, f"tile {i} not fenced"
        commit = TileCommit(
            job_id,
            i,
            token=token,
            attempt_id=attempt,
            result_key=None,
            result_sha256="sha",
            result_data=DATA,
            samples_done=1,
            node="bench",
        )
        await db.commit_tile(commit)


async def _timed(db: MetadataStore, tiles: int, owners: int, takeover: bool) -> float:
    job_id = await _job(db, tiles)
    if takeover:  # a first owner fences every tile and vanishes without a commit
        for i in range(tiles):
            assert await db.fence_tile(job_id, i, token=1, attempt_id=f"old-{i}", node="gone")
    share = range(0, tiles)
    started = time.perf_counter()
    await asyncio.gather(
        *(_owner(db, job_id, share[k::owners], 2 if takeover else 1) for k in range(owners))
    )
    return time.perf_counter() - started


async def _rounds(db: MetadataStore, tiles: int) -> float:
    """Seconds of ``tiles`` release rounds of one tile each (the window grows by one a round)."""
    job_id = await _job(db, tiles)
    started = time.perf_counter()
    for k in range(1, tiles + 1):
        released = await db.release_tiles({"tessera": k}, limit=100, usage_window=300)
        assert len(released.tiles) == 1, f"round {k} released {len(released.tiles)} tiles"
    seconds = time.perf_counter() - started
    await db.request_cancel(job_id)  # its released tiles leave the next round's window
    return seconds


async def run(dsn: str, tiles: int, owners: int, rounds: int) -> None:
    db = await MetadataStore.connect(dsn, max_size=owners + 2)
    try:
        await _timed(db, 32, 1, False)  # warm the pool and the plans
        cases: dict[str, list[float]] = {"a": [], "b": [], "c": [], "d": []}
        for _ in range(rounds):
            cases["a"].append(await _timed(db, tiles, 1, False))
            cases["b"].append(await _timed(db, tiles, owners, False))
            cases["c"].append(await _timed(db, tiles, 1, True))
            cases["d"].append(await _rounds(db, tiles))
        a, b, c, d = (statistics.median(cases[k]) for k in "abcd")
        print(f"(a) one owner: {a / tiles * 1000:.2f} ms per tile (fence + commit), "
              f"{tiles / a:.0f} tiles/s")  # fmt: skip
        print(f"(b) {owners} owners: {tiles / b:.0f} tiles/s")
        print(
            f"(c) takeovers, one owner: {c / tiles * 1000:.2f} ms per tile, {tiles / c:.0f} tiles/s"
        )
        print(f"(d) dispatch rounds of one tile: {d / tiles * 1000:.2f} ms per round")
        print(f"    {tiles} tiles per case, median of {rounds} rounds")
    finally:
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, default=SIDE * SIDE, help="tiles per case")
    parser.add_argument("--owners", type=int, default=4, help="concurrent owners in (b)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument(
        "--no-fsync", action="store_true", help="PostgreSQL without fsync: round trips only"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        server = PostgresServer(Path(tmp), durable=not args.no_fsync)
        server.start()
        try:
            asyncio.run(run(server.dsn, args.tiles, args.owners, args.rounds))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
