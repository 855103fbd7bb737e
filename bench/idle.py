"""A/B of an idle stack's CPU (not a test): what a farm with nothing to render costs its cores.

Run: ``python -m bench.idle TREE_A TREE_B [--pairs 3] [--seconds 10]``.
Each tree is a checkout of this repository (``git worktree add /tmp/a <commit>``). For each
tree in turn, A B B A A B ..., a fresh stack (NATS, PostgreSQL, the directory store) and one
set of services from that tree (gateway, scheduler, finalizer, one worker) start, render one
tiny job (processes up, JIT loaded), and are then left alone for ``--seconds``: the CPU of
every process over that span (:func:`bench.coordination.cpu_ms`, per thread, its children
included) and NATS's messages in and out (``/varz``) are read before and after. Printed: per
tree, the medians per process in core-ms per second of wall time, and B/A of the totals.

Idle CPU is paid during every render too: on two shared cores, each core-ms a second the
servers and services take is a core-ms the kernel threads lose (issue 19, (a) and (a auto)).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.coordination import _create_databases, _start, cpu_ms
from bench.counters import POSTGRES_OPTIONS, nats_messages
from bench.pipeline import timed_job
from proto.api import SubmitRequest
from shared.devstack.stack import Stack

_TAG = "idle"


def idle_rates(tree: Path, seconds: float) -> tuple[dict[str, float], float]:
    """``({process: core-ms per second}, NATS messages in+out per second)`` of an idle stack
    running ``tree``'s services."""
    with (
        tempfile.TemporaryDirectory(prefix="tessera-idle-") as tmp,
        Stack(Path(tmp), postgres_options=POSTGRES_OPTIONS) as stack,
    ):
        asyncio.run(_create_databases(stack.postgres.dsn, [_TAG]))
        procs, env = _start(stack, tree, _TAG, {}, Path(tmp))
        try:
            warm = SubmitRequest(project="p", scene="cornell", width=64, height=64, spp=1)
            asyncio.run(timed_job(env, warm))
            every = {n: p.pid for n, p in procs.procs.items()}
            every |= {"nats": stack.nats.proc.pid, "postgres": stack.postgres.proc.pid}
            pids = {n: pid for n, pid in every.items() if pid is not None}
            before = {n: sum(cpu_ms(p)) for n, p in pids.items()}
            msgs = nats_messages(stack.nats.monitor_port)
            start = time.monotonic()
            time.sleep(seconds)  # (the measured span: nothing is submitted during it)
            wall = time.monotonic() - start
            after = {n: sum(cpu_ms(p)) for n, p in pids.items()}
            later = nats_messages(stack.nats.monitor_port)
        finally:
            procs.stop_all()
    rates = {n: (after[n] - before[n]) / wall for n in after}
    return rates, (later[0] - msgs[0] + later[1] - msgs[1]) / wall


def main() -> None:
    """Alternate the trees' idle stacks, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree_a", type=Path)
    parser.add_argument("tree_b", type=Path)
    parser.add_argument("--pairs", type=int, default=3, help="idle spans per tree")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one idle span")
    args = parser.parse_args()
    trees = [args.tree_a.resolve(), args.tree_b.resolve()]
    totals: list[list[float]] = [[], []]
    messages: list[list[float]] = [[], []]
    by_process: list[defaultdict[str, list[float]]] = [defaultdict(list), defaultdict(list)]
    for r in range(args.pairs):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            rates, msgs = idle_rates(trees[i], args.seconds)
            totals[i].append(sum(rates.values()))
            messages[i].append(msgs)
            for n, v in rates.items():
                by_process[i][n].append(v)
            print(f"    span {r + 1} {'AB'[i]}: {sum(rates.values()):.1f} core-ms/s, "
                  f"NATS {msgs:.1f} msgs/s")  # fmt: skip
    for i in (0, 1):
        medians = {n: round(statistics.median(v), 2) for n, v in by_process[i].items()}
        print(f"{'AB'[i]} {trees[i]}: idle {statistics.median(totals[i]):.1f} core-ms/s, "
              f"NATS {statistics.median(messages[i]):.1f} msgs/s (in + out)")  # fmt: skip
        print(f"    by process (core-ms/s, medians): {medians}")
    a, b = statistics.median(totals[0]), statistics.median(totals[1])
    print(f"B / A idle CPU: {b / a:.3f}")


if __name__ == "__main__":
    main()
