"""What one tile costs the coordination: CPU, NATS messages and SQL statements (bench helpers).

A :class:`Counters` reads, at one instant, everything the pipeline benchmark divides by the
number of tiles of a job:

- **CPU** (user + system) of every process of the stack — NATS, PostgreSQL (the postmaster, its
  backends alive now and those it has reaped), the four services and their own children (the
  gateway's submit-checking process) — and, separately, that of the worker's *kernel threads*.
  Coordination CPU is the first minus the second. Kernel threads are told apart by name: the
  services run with :mod:`bench.threadnames` first on ``PYTHONPATH``, which gives each Python
  thread its name at the OS level, and the worker's kernel pool names its threads
  ``kernel_<n>`` (``services/worker/kernels.py``);
- **NATS messages**: ``in_msgs`` and ``out_msgs`` of the server's ``/varz`` monitoring page
  (every message a client published, and every copy delivered to a subscriber, JetStream's
  API requests, acks and deliveries included);
- **SQL statements**: the sum of ``calls`` in ``pg_stat_statements`` (every statement executed,
  transaction control included; the counter's own queries left out), and the committed
  transactions of ``pg_stat_database``. The bench's PostgreSQL preloads the extension
  (:data:`POSTGRES_OPTIONS`).

The difference of two readings (:meth:`Counters.minus`) is what happened between them. The
bench's own client process (submit, one event subscription) is not counted as CPU; its few
NATS messages are.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from shared.devstack.stack import Stack

__all__ = [
    "KERNEL_THREAD_PREFIX",
    "POSTGRES_OPTIONS",
    "CounterReader",
    "Counters",
    "Phases",
    "enable_statement_counts",
    "job_phases",
    "nats_messages",
    "pin_process_tree",
    "pin_thread",
    "process_tree_cpu",
    "service_env",
    "sql_counts",
    "threads_named",
]

#: PostgreSQL settings the bench's server starts with: statements are counted exactly
POSTGRES_OPTIONS = (
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.track=top",
    "pg_stat_statements.track_utility=on",
    "pg_stat_statements.max=10000",
)
#: OS-level name prefix of the worker's kernel threads (with :mod:`bench.threadnames`)
KERNEL_THREAD_PREFIX = "kernel_"
_THREADNAMES_DIR = Path(__file__).resolve().parent / "threadnames"
_MARK = "/* tessera-bench-counter */"


def service_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that puts the thread-naming hook first on a service's ``PYTHONPATH``."""
    base = os.environ if base is None else base
    rest = base.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(_THREADNAMES_DIR), rest) if p)}


@dataclass(frozen=True)
class Counters:
    """One reading (or the difference of two) of the stack's counters."""

    #: CPU seconds of every process of the stack, kernel threads included
    cpu_seconds: float
    #: CPU seconds of the workers' kernel threads
    kernel_seconds: float
    #: how many kernel threads were found (0 means the naming hook did not take)
    kernel_threads: int
    nats_in: int
    nats_out: int
    sql_statements: int
    #: of which transaction control (BEGIN, COMMIT, ...)
    sql_control: int
    #: coordination CPU seconds by process: ``nats``, ``postgres``, ``s3`` and each service
    #: (a worker's kernel threads left out)
    by_process: Mapping[str, float] = field(default_factory=dict)

    @property
    def coordination_seconds(self) -> float:
        """CPU seconds not spent in the kernel threads."""
        return self.cpu_seconds - self.kernel_seconds

    def minus(self, before: Counters) -> Counters:
        """What happened since ``before`` (``kernel_threads``: the larger count)."""
        return Counters(
            cpu_seconds=self.cpu_seconds - before.cpu_seconds,
            kernel_seconds=self.kernel_seconds - before.kernel_seconds,
            kernel_threads=max(self.kernel_threads, before.kernel_threads),
            nats_in=self.nats_in - before.nats_in,
            nats_out=self.nats_out - before.nats_out,
            sql_statements=self.sql_statements - before.sql_statements,
            sql_control=self.sql_control - before.sql_control,
            by_process={
                name: cpu - before.by_process.get(name, 0.0)
                for name, cpu in self.by_process.items()
            },
        )

    def per_tile(self, tiles: int) -> dict[str, float]:
        """The figures per tile: coordination core-ms, NATS messages, SQL statements."""
        return {
            "coordination_ms": 1000 * self.coordination_seconds / tiles,
            "kernel_ms": 1000 * self.kernel_seconds / tiles,
            "nats_in": self.nats_in / tiles,
            "nats_out": self.nats_out / tiles,
            "sql_statements": self.sql_statements / tiles,
            "sql_control": self.sql_control / tiles,
        }

    def by_process_ms(self, tiles: int) -> dict[str, float]:
        """Coordination core-ms per tile of each process, largest first."""
        rows = {name: 1000 * cpu / tiles for name, cpu in self.by_process.items()}
        return dict(sorted(rows.items(), key=lambda kv: -kv[1]))


def nats_messages(monitor_port: int, host: str = "127.0.0.1") -> tuple[int, int]:
    """``(in_msgs, out_msgs)`` from nats-server's ``/varz``."""
    with urllib.request.urlopen(f"http://{host}:{monitor_port}/varz", timeout=5) as reply:
        varz = json.load(reply)
    return int(varz["in_msgs"]), int(varz["out_msgs"])


async def enable_statement_counts(dsn: str) -> None:
    """``CREATE EXTENSION pg_stat_statements`` (the library must be preloaded)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    finally:
        await conn.close()


async def sql_counts(conn: asyncpg.Connection) -> tuple[int, int]:
    """``(statements, of which transaction control)`` the whole server has executed so far.

    ``sum(calls)`` of ``pg_stat_statements`` over every database and user, but for the
    counter's own query (marked by a comment inside it, which the extension keeps in its text). The
    extension updates its counts as each statement ends (``pg_stat_database``'s are flushed
    lazily, up to seconds later, so they are not used). Transaction control: ``BEGIN``,
    ``COMMIT``, ``ROLLBACK``, savepoints.
    """
    row = await conn.fetchrow(
        f"SELECT {_MARK} coalesce(sum(calls), 0)::bigint AS total, coalesce(sum(calls) FILTER "
        "(WHERE query ~* '^\\s*(begin|start transaction|commit|end|rollback|savepoint|release)'"
        "), 0)::bigint AS control FROM pg_stat_statements "
        f"WHERE query NOT LIKE '%{_MARK}%'"
    )
    assert row is not None
    return int(row["total"]), int(row["control"])


@dataclass(frozen=True)
class Phases:
    """Where a job's wall time went, from its own rows: ``lead``, the submit (the job's first
    event) to the first tile attempt's start; ``span``, the first tile attempt's start to the
    last one's end; ``tail``, that end to the job's last event (completed)."""

    lead: float
    span: float
    tail: float

    def busy(self, kernel_seconds: float, threads: int) -> float:
        """The kernel threads' CPU as a fraction of ``threads`` x ``span``: how much of the
        render span the kernels ran (what is missing went to other work on their cores, or
        to waiting for a tile or a pass)."""
        return kernel_seconds / (threads * self.span) if threads and self.span > 0 else 0.0


_PHASES = f"""
SELECT {_MARK}
  (SELECT min(at) FROM job_events WHERE job_id = $1) AS submitted,
  (SELECT max(at) FROM job_events WHERE job_id = $1) AS settled,
  min(started_at) AS first, max(ended_at) AS last
FROM attempts WHERE job_id = $1 AND tile_index IS NOT NULL
"""


async def job_phases(dsn: str, job_id: str) -> Phases:
    """The :class:`Phases` of a settled job (its tile attempts all ended)."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(_PHASES, job_id)
    finally:
        await conn.close()
    if row is None or row["first"] is None or row["last"] is None:
        raise ValueError(f"job {job_id} has no ended tile attempts")
    return Phases(
        lead=(row["first"] - row["submitted"]).total_seconds(),
        span=(row["last"] - row["first"]).total_seconds(),
        tail=(row["settled"] - row["last"]).total_seconds(),
    )


def _cpu(times: Any) -> float:
    return float(times.user + times.system)


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``, of its live descendants, and of the children it has reaped.

    The difference of two readings is exact as long as the reaped children were waited for
    by ``pid`` itself (PostgreSQL's postmaster reaps its backends; a process pool its
    workers). A process that is gone counts 0.
    """
    try:
        root = psutil.Process(pid)
        times = root.cpu_times()
        total = _cpu(times) + float(times.children_user + times.children_system)
        descendants = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    for child in descendants:
        # one just reaped: from now on its parent's children_* time has it
        with contextlib.suppress(psutil.NoSuchProcess):
            total += _cpu(child.cpu_times())
    return total


def threads_named(pid: int, prefix: str) -> dict[int, float]:
    """``{tid: CPU seconds}`` of the threads of ``pid`` whose OS name starts with ``prefix``."""
    found: dict[int, float] = {}
    try:
        threads = psutil.Process(pid).threads()
    except psutil.NoSuchProcess:
        return found
    for thread in threads:
        try:
            name = Path(f"/proc/{pid}/task/{thread.id}/comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        if name.startswith(prefix):
            found[thread.id] = float(thread.user_time + thread.system_time)
    return found


class CounterReader:
    """Reads :class:`Counters` of one stack over one PostgreSQL connection of its own."""

    def __init__(self, stack: Stack, conn: asyncpg.Connection) -> None:
        self.stack = stack
        self.conn = conn

    @classmethod
    async def open(cls, stack: Stack) -> CounterReader:
        """Connect (the extension must be created, see :func:`enable_statement_counts`)."""
        return cls(stack, await asyncpg.connect(stack.postgres.dsn))

    async def close(self) -> None:
        """Close the connection."""
        await self.conn.close()

    async def read(self, service_pids: Mapping[str, int]) -> Counters:
        """One reading; ``service_pids``: name -> PID of each service (workers: ``worker*``).

        CPU is read first, NATS and SQL after: the counters' own work (one HTTP request to the
        NATS monitor, one query) falls after the CPU reading, and the SQL query is left out of
        the statement count.
        """
        named = {
            name: server.proc.pid
            for name, server in (
                ("nats", self.stack.nats),
                ("postgres", self.stack.postgres),
                ("s3", self.stack.s3),
            )
            if server is not None and server.proc.pid is not None and server.proc.alive()
        } | dict(service_pids)
        by_process = {name: process_tree_cpu(pid) for name, pid in named.items()}
        cpu = sum(by_process.values())
        kernel: dict[int, float] = {}
        for name, pid in service_pids.items():
            if name.startswith("worker"):
                threads = threads_named(pid, KERNEL_THREAD_PREFIX)
                by_process[name] -= sum(threads.values())
                kernel |= threads
        nats_in, nats_out = nats_messages(self.stack.nats.monitor_port)
        statements, control = await sql_counts(self.conn)
        return Counters(
            cpu_seconds=cpu,
            kernel_seconds=sum(kernel.values()),
            kernel_threads=len(kernel),
            nats_in=nats_in,
            nats_out=nats_out,
            sql_statements=statements,
            sql_control=control,
            by_process=by_process,
        )


def pin_thread(tid: int, cores: set[int]) -> None:
    """Pin one thread (Linux affinity is per thread; threads it starts later inherit it)."""
    os.sched_setaffinity(tid, cores)


def pin_process_tree(pid: int, cores: set[int], *, keep: Iterable[int] = ()) -> None:
    """Pin every thread of ``pid`` and of its descendants to ``cores``, but the tids ``keep``.

    Processes and threads started later inherit the affinity of their creator.
    """
    skip = set(keep)
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    for proc in procs:
        try:
            tids = [t.id for t in proc.threads()]
        except psutil.NoSuchProcess:
            continue
        for tid in tids:
            if tid in skip:
                continue
            with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
                pin_thread(tid, cores)
