"""A/B of coordination CPU per tile (not a test): two sets of services on one stack, alternated.

Run: ``python -m bench.coordination TREE_A TREE_B [--rounds 6] [--tile 64|auto] [--env-a K=V,...]
[--env-b ...]``.
Each tree is a checkout of this repository (``git worktree add /tmp/a <commit>``; the same path
twice compares two environments). Both sets — gateway, scheduler, finalizer, one worker — run
at once on one NATS and one PostgreSQL, each in its own namespace and database, and their jobs
(512x512, 64 spp, 64x64 tiles: ``bench.pipeline`` (a); ``--tile auto``: (a auto)) alternate
A B B A A B ..., so a slow spell of this shared machine weighs on both alike.

Per job and process, the CPU of every thread (``/proc/<pid>/task/<tid>/schedstat``: run time
in nanoseconds, where ``bench.counters`` reads clock ticks of 10 ms) of the service or server
and its children, the worker's kernel threads (``kernel_<n>``, named by ``bench/threadnames/``)
counted apart: coordination = the rest, divided by the tiles. Only threads and processes alive
at both readings count: one that ends during a job (a PostgreSQL backend of a reconnect) takes
its CPU with it, alike for both sets. Printed: the medians per tree and
per process, the ratio of coordination to kernel CPU, and the job's tail: its last tile's end to
its last event, completed (``bench.counters.job_phases``: the finalization a client waits for
after the render). NATS and PostgreSQL serve both sets,
so their figures include the idle set's few background requests, alike for both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import asyncpg
import psutil

from bench.counters import POSTGRES_OPTIONS, job_phases
from bench.pipeline import timed_job
from proto.api import SubmitRequest
from services.cli.local import ServiceProcesses
from shared.devstack.stack import Stack

_THREADNAMES = Path(__file__).resolve().parent / "threadnames"


def _env_arg(text: str) -> dict[str, str]:
    pairs = [kv.split("=", 1) for kv in text.split(",") if kv]
    if any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected K=V,K=V: {text!r}")
    return dict((k, v) for k, v in pairs)


def _tile_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a tile edge or 'auto': {text!r}") from None


def cpu_ms(pid: int) -> tuple[float, float]:
    """(coordination, kernel-thread) CPU milliseconds of ``pid`` and its children so far."""
    coord = kern = 0
    try:
        procs = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    for p in procs:
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                ns = int((task / "schedstat").read_text().split()[0])
                comm = (task / "comm").read_text()
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended between the listing and the read
            if comm.startswith("kernel_"):
                kern += ns
            else:
                coord += ns
    return coord / 1e6, kern / 1e6


async def _create_databases(dsn: str, names: list[str]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for name in names:
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


def _start(stack: Stack, tree: Path, tag: str, extra: Mapping[str, str], logs: Path) -> tuple[
    ServiceProcesses, dict[str, str]
]:  # fmt: skip
    dsn = stack.postgres.dsn.rsplit("/", 1)[0] + f"/{tag}"
    env = (
        stack.env()
        | {
            "TESSERA_NAMESPACE": tag,
            "TESSERA_WORKER_SLOTS": str(os.cpu_count() or 1),
            "TESSERA_DATABASE_URL": dsn,
            "PYTHONPATH": os.pathsep.join([str(_THREADNAMES), str(tree)]),
        }
        | dict(extra)
    )
    procs = ServiceProcesses(env, logs / tag, tree=tree)  # (``-m services.<name>`` from there)
    procs.start_all(workers=1)
    return procs, env


def main() -> None:
    """Start both sets, alternate their jobs, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree_a", type=Path)
    parser.add_argument("tree_b", type=Path)
    parser.add_argument("--rounds", type=int, default=6, help="jobs per set")
    parser.add_argument("--tile", type=_tile_arg, default=64, help="tile edge or 'auto'")
    parser.add_argument("--env-a", type=_env_arg, default={}, help="K=V,... for set A")
    parser.add_argument("--env-b", type=_env_arg, default={}, help="K=V,... for set B")
    args = parser.parse_args()
    trees = [args.tree_a.resolve(), args.tree_b.resolve()]
    extras = [args.env_a, args.env_b]
    tags = ["coord_a", "coord_b"]
    with (
        tempfile.TemporaryDirectory(prefix="tessera-coord-") as tmp,
        Stack(Path(tmp), postgres_options=POSTGRES_OPTIONS) as stack,
    ):
        asyncio.run(_create_databases(stack.postgres.dsn, tags))
        sets = [
            _start(stack, t, tag, e, Path(tmp))
            for t, tag, e in zip(trees, tags, extras, strict=True)
        ]
        per_tile: list[list[float]] = [[], []]
        ratio: list[list[float]] = [[], []]
        walls: list[list[float]] = [[], []]
        tails: list[list[float]] = [[], []]
        by_process: list[defaultdict[str, list[float]]] = [defaultdict(list), defaultdict(list)]
        try:
            for i, (_, env) in enumerate(sets):  # processes up, JIT cache loaded
                warm = SubmitRequest(project=f"p{i}", scene="cornell", width=64, height=64, spp=1)
                asyncio.run(timed_job(env, warm))
            for r in range(args.rounds):
                for i in (0, 1) if r % 2 == 0 else (1, 0):
                    procs, env = sets[i]
                    every = {n: p.pid for n, p in procs.procs.items()}
                    every |= {"nats": stack.nats.proc.pid, "postgres": stack.postgres.proc.pid}
                    pids = {n: pid for n, pid in every.items() if pid is not None}
                    before = {n: cpu_ms(p) for n, p in pids.items()}
                    job = SubmitRequest(project=f"p{i}", scene="cornell", width=512, height=512,
                                        spp=64, tile_size=args.tile, seed=r)  # fmt: skip
                    seconds, status, _ = asyncio.run(timed_job(env, job))
                    after = {n: cpu_ms(p) for n, p in pids.items()}
                    tiles = int(status["tiles_total"])
                    coord = sum(after[n][0] - before[n][0] for n in after)
                    kern = sum(after[n][1] - before[n][1] for n in after)
                    per_tile[i].append(coord / tiles)
                    ratio[i].append(100 * coord / kern if kern else float("nan"))
                    walls[i].append(seconds)
                    dsn = env["TESSERA_DATABASE_URL"]
                    tail = asyncio.run(job_phases(dsn, str(status["job_id"]))).tail
                    tails[i].append(1000 * tail)
                    for n in after:
                        by_process[i][n].append((after[n][0] - before[n][0]) / tiles)
                    print(
                        f"    round {r + 1} {'AB'[i]}: {coord / tiles:.2f} core-ms per tile, "
                        f"{seconds:.3f} s, last tile to completed {1000 * tail:.0f} ms"
                    )
        finally:
            for procs, _ in sets:
                procs.stop_all()
    for i in (0, 1):
        print(f"{'AB'[i]} {trees[i]} {extras[i] or ''}")
        print(f"    coordination per tile: median {statistics.median(per_tile[i]):.2f} core-ms, "
              f"{statistics.median(ratio[i]):.2f} % of the kernel threads' CPU; "
              f"job wall median {statistics.median(walls[i]):.3f} s, last tile to completed "
              f"median {statistics.median(tails[i]):.0f} ms")  # fmt: skip
        medians = {n: round(statistics.median(v), 2) for n, v in by_process[i].items()}
        print(f"    by process (core-ms per tile, medians): {medians}")
    a, b = statistics.median(per_tile[0]), statistics.median(per_tile[1])
    print(f"B / A coordination per tile: {b / a:.3f}")
    ta, tb = statistics.median(tails[0]), statistics.median(tails[1])
    print(f"B / A last tile to completed: {tb / ta:.3f}")


if __name__ == "__main__":
    main()
