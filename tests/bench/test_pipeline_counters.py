"""The pipeline benchmark's counters on a tiny real job (no timing assertions)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.counters import (
    KERNEL_THREAD_PREFIX,
    POSTGRES_OPTIONS,
    CounterReader,
    Phases,
    enable_statement_counts,
    job_phases,
    nats_messages,
    process_tree_cpu,
    threads_named,
)
from bench.pipeline import timed_job, with_services
from proto.api import SubmitRequest
from shared.core.config import Settings
from shared.devstack.stack import Stack
from shared.nats.jetstream import connect_nats
from tests.helpers import eventually


@pytest.fixture
def counted_stack(server_dir: Path) -> Iterator[Stack]:
    """A stack of this test's own whose PostgreSQL counts statements (pg_stat_statements)."""
    with Stack(server_dir, durable=False, postgres_options=POSTGRES_OPTIONS) as stack:
        asyncio.run(enable_statement_counts(stack.postgres.dsn))
        yield stack


def test_counters_of_a_tiny_job_are_positive_and_consistent(counted_stack: Stack) -> None:
    stack = counted_stack
    env = {"TESSERA_NAMESPACE": "counters", "TESSERA_WORKER_SLOTS": "2"}
    procs = with_services(stack, env, workers=1)
    try:
        # 4 tiles of 16x16; enough samples that the kernel threads show CPU
        request = SubmitRequest(project="counters", scene="cornell", width=32, height=32,
                                spp=16, tile_size=16)  # fmt: skip
        seconds, status, counters = asyncio.run(timed_job(stack.env() | env, request, stack, procs))
        assert status["state"] == "completed", procs.logs()
        phases = asyncio.run(job_phases(stack.postgres.dsn, status["job_id"]))
        assert counters is not None
        worker = procs.procs["worker-1"].pid
        assert worker is not None
        kernel_threads = threads_named(worker, KERNEL_THREAD_PREFIX)
    finally:
        procs.stop_all()
    # the thread-naming hook took: the worker's kernel pool threads are found by name
    assert 1 <= counters.kernel_threads <= 2
    assert len(kernel_threads) == counters.kernel_threads
    assert counters.kernel_seconds > 0
    assert counters.cpu_seconds > counters.kernel_seconds  # coordination costs something
    # the job's own messages and statements went through the servers
    assert counters.nats_in > 0 and counters.nats_out > 0
    assert counters.sql_statements > 0
    assert 0 < counters.sql_control < counters.sql_statements  # transactions, and their work
    per_tile = counters.per_tile(4)
    assert all(math.isfinite(v) and v > 0 for v in per_tile.values()), per_tile
    # the job's phases come from its own rows: each one positive, and together within the
    # time the client measured from its submit to the completed event
    assert phases.lead > 0 and phases.span > 0 and phases.tail > 0, phases
    assert phases.lead + phases.span + phases.tail <= seconds, (phases, seconds)


def test_kernel_busy_is_kernel_cpu_over_threads_times_span() -> None:
    phases = Phases(lead=0.02, span=4.0, tail=0.07)
    assert phases.busy(7.6, 2) == pytest.approx(0.95)
    assert phases.busy(4.0, 1) == pytest.approx(1.0)
    assert Phases(0.0, 0.0, 0.0).busy(1.0, 2) == 0.0, "no span: nothing to divide by"
    assert phases.busy(1.0, 0) == 0.0, "no kernel thread found"


def test_the_nats_counters_count_a_publish_and_the_reader_ignores_its_own_queries(
    counted_stack: Stack,
) -> None:
    stack = counted_stack

    async def run() -> tuple[tuple[int, int], tuple[int, int], int, int]:
        settings = Settings.from_env(stack.env())
        before = nats_messages(stack.nats.monitor_port)
        nc = await connect_nats(settings, name="counter-test")
        try:
            for _ in range(5):
                await nc.publish("counter.test", b"x")
            await nc.flush()
        finally:
            await nc.close()

        # /varz sums the clients' counts as the server gets to them, not at the PONG that
        # ends the flush: on a loaded machine it once still read 0 here.
        def counted() -> tuple[int, int] | None:
            now = nats_messages(stack.nats.monitor_port)
            return now if now[0] - before[0] >= 5 else None

        after = await eventually(counted, what="the server's /varz counted the publishes")
        reader = await CounterReader.open(stack)
        try:
            first = (await reader.read({})).sql_statements
            second = (await reader.read({})).sql_statements
        finally:
            await reader.close()
        return before, after, first, second

    before, after, first, second = asyncio.run(run())
    assert after[0] - before[0] >= 5  # every publish counted in
    assert second == first  # reading the counter is not itself counted
    assert process_tree_cpu(stack.postgres.proc.pid or 0) > 0
