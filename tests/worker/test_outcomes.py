"""How a tile attempt ends when its owner loses the tile: what it counts, logs and records.

Two workers run in this process on the test's real NATS, PostgreSQL and object store, each
with its own connections, kernel threads and metrics. A worker is held inside its last sample
pass by keeping its only kernel thread busy (the pass waits for the thread, as behind a long
pass of another tile), so what happens to its lease meanwhile is decided by the test, not by
timing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

import kernel
from proto import names as n
from proto.messages import JobMessage, TileMessage
from services.gateway.handlers import Handlers
from services.scheduler.dispatch import Dispatcher
from services.scheduler.exhausted import Exhausted
from services.scheduler.planner import Planner
from services.worker.loop import Worker
from services.worker.scenes import KernelFailure
from shared.core.config import Settings
from shared.core.errors import StoreUnavailable
from shared.core.lifecycle import IllegalTransition, TileState
from shared.metadata import Attempt, AttemptOutcome
from shared.nats.leases import LeaseOwner
from shared.objectstore import DirectoryStore
from shared.service.runtime import Runtime
from tests.helpers import eventually

#: one 16x16 tile, one pass of 4 samples, its result inline (the commit is the last step)
BODY = {"project": "outcomes", "scene": "cornell", "width": 16, "height": 16, "spp": 4,
        "tile_size": 16}  # fmt: skip


@dataclass
class Held:
    """A delivery being handled, and the gate its pass waits behind."""

    task: asyncio.Task[None]
    gate: threading.Event
    msg: Msg

    async def release(self) -> None:
        """Let the pass run and wait for the delivery to be settled."""
        self.gate.set()
        await asyncio.wait_for(self.task, 60)


@dataclass
class Node:
    """One worker of the test: its runtime, its worker and a pull subscription for it."""

    rt: Runtime
    worker: Worker

    async def fetch(self) -> Msg:
        sub = await self.rt.js.pull_subscribe_bind(
            durable=n.CONSUMER_WORKERS, stream=self.rt.names.stream(n.STREAM_TILES)
        )
        try:
            (msg,) = await sub.fetch(1, timeout=10)
        finally:
            await sub.unsubscribe()
        return msg

    def count(self, name: str, **labels: str) -> float:
        return self.rt.metrics.registry.get_sample_value(name, labels) or 0.0


def _env(settings_env: dict[str, str], node: str, **tuning: str) -> dict[str, str]:
    return (
        settings_env
        | {
            "TESSERA_NODE": node,
            "TESSERA_WORKER_SLOTS": "1",
            "TESSERA_SAMPLES_PER_PASS": "4",
            "TESSERA_CHECKPOINT_INTERVAL": "600",
            "TESSERA_LOG_LEVEL": "INFO",
        }
        | {f"TESSERA_{k.upper()}": v for k, v in tuning.items()}
    )


@asynccontextmanager
async def _node(env: dict[str, str]) -> AsyncIterator[Node]:
    rt = await Runtime.open(Settings.from_env(env), "worker")
    worker = Worker(rt)
    try:
        yield Node(rt, worker)
    finally:
        worker.kernels.executor.shutdown(wait=True)
        await rt.close()


async def _submit(rt: Runtime, **over: Any) -> str:
    handlers = Handlers(rt.db, rt.js, rt.names, rt.log)
    job_id = (await handlers.submit(orjson.dumps(BODY | over), None)).job_id
    await Planner(rt).plan(JobMessage(job_id, 0))
    await Dispatcher(rt).dispatch_once({"tessera": 1000})  # released: its TILES messages
    return job_id


@asynccontextmanager
async def _held(node: Node, job_id: str, *, in_pass: bool = True) -> AsyncIterator[Held]:
    """Deliver the tile to ``node``; inside, it is fenced and waits for its only kernel thread:
    in its first pass (the scene prepared beforehand), or else in the scene's preparation."""
    job = await node.worker.job(job_id)
    assert job is not None
    if in_pass:
        await node.worker.scenes.get(job, node.worker.renderers["tessera"])
    gate = threading.Event()
    blocker = node.worker.kernels.executor.submit(gate.wait, 300)
    try:
        msg = await node.fetch()
        held = Held(asyncio.create_task(node.worker.handle(msg)), gate, msg)
        if in_pass:
            await eventually(lambda: node.worker.kernels.running == 1, what="the pass waits")
        else:
            await eventually(lambda: node.rt.db.attempts(job_id), what="the tile is fenced")
        yield held
        assert blocker.done() and blocker.result(), "the test, not a timeout, let it run"
    finally:
        gate.set()


async def _expire_lease(js: JetStreamContext, names: n.Names, job_id: str) -> None:
    """What the server's TTL does to an owner that stopped renewing: the key is gone."""
    kv = await js.key_value(names.bucket(n.BUCKET_LEASES))
    await kv.delete(n.lease_key_tile(job_id, 0))


async def _attempt_of(node: Node, job_id: str) -> Attempt:
    (mine,) = [a for a in await node.rt.db.attempts(job_id) if a.node == node.rt.node]
    return mine


def _lines(caplog: pytest.LogCaptureFixture, attempt_id: str) -> Callable[[str], list[str]]:
    def lines(msg: str) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.getMessage() == msg and getattr(r, "fields", {}).get("attempt_id") == attempt_id
        ]

    return lines


async def test_a_commit_refused_as_already_done_is_not_counted_as_this_workers_tile(
    settings_env: dict[str, str], database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # A's heartbeat stays silent for the whole test: it never learns that its lease is gone.
    slow = {"lease_ttl": "3600", "heartbeat_interval": "1800", "ack_wait": "7200"}
    async with (
        _node(_env(settings_env, "worker-a", **slow)) as a,
        _node(_env(settings_env, "worker-b", **slow)) as b,
    ):
        job_id = await _submit(a.rt)
        async with _held(a, job_id) as held:
            first = await _attempt_of(a, job_id)
            await _expire_lease(a.rt.js, a.rt.names, job_id)
            # The sweeper's copy of the tile (the generation after the release's 1) goes to B,
            # which takes over.
            copy = TileMessage(job_id, 0, generation=2)
            await a.rt.js.publish(
                a.rt.names.tile_subject(job_id, 0),
                copy.encode(),
                headers={"Nats-Msg-Id": n.tile_msg_id(job_id, 0, 2)},
            )
            await asyncio.wait_for(b.worker.handle(await b.fetch()), 60)
            tile = await b.rt.db.get_tile(job_id, 0)
            assert tile is not None and tile.state is TileState.DONE
            assert tile.lease_fence > first.fence, "B committed under its own, newer fence"
            await held.release()  # A finishes its pass and commits with its stale fence

        assert b.count("tessera_tiles_completed_total") == 1
        assert a.count("tessera_tiles_completed_total") == 0, "B's commit is not A's tile"
        assert a.count("tessera_tile_commits_refused_total", reason="already_done") == 1
        assert a.count("tessera_tile_duration_seconds_count") == 0
        lines = _lines(caplog, first.attempt_id)
        assert lines("tile done") == []
        assert lines("commit refused: another owner committed the tile first")
        ended = await _attempt_of(a, job_id)
        assert ended.outcome is AttemptOutcome.FENCED and ended.ended_at is not None
        committed = [e for e in await a.rt.db.job_events(job_id) if e.to_state == "done"]
        assert [e.node for e in committed] == ["worker-b"], "one commit, by B"


async def test_a_lease_lost_after_the_last_pass_ends_the_attempt_as_lease_lost(
    settings_env: dict[str, str], database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    beating = {"lease_ttl": "10", "heartbeat_interval": "0.1", "ack_wait": "30"}
    async with _node(_env(settings_env, "worker-a", **beating)) as a:
        job_id = await _submit(a.rt)
        async with _held(a, job_id) as held:
            first = await _attempt_of(a, job_id)
            lost = _lines(caplog, first.attempt_id)
            await _expire_lease(a.rt.js, a.rt.names, job_id)
            await eventually(lambda: lost("lease lost"), what="the heartbeat notices")
            await held.release()  # the last pass ends: the next step is the commit

        ended = await _attempt_of(a, job_id)
        assert ended.outcome is AttemptOutcome.LEASE_LOST, ended
        assert ended.ended_at is not None and ended.error_code == "lease_lost"
        assert a.count("tessera_tiles_completed_total") == 0
        assert lost("tile stopped"), "stopped like a loss between passes"
        tile = await a.rt.db.get_tile(job_id, 0)
        assert tile is not None and tile.state is not TileState.DONE, "nothing committed"


async def _dead_letter(rt: Runtime, held: Held) -> None:
    """What the scheduler does when the tile's message ran out of deliveries (its advisory)."""
    seq = held.msg.metadata.sequence.stream
    await Exhausted(rt).exhausted(rt.names.stream(n.STREAM_TILES), seq, 5)


async def test_a_retryable_failure_after_the_tile_was_dead_lettered_still_ends_the_attempt(
    settings_env: dict[str, str], database_url: str
) -> None:
    env = _env(settings_env, "worker-a", inline_result_bytes="0")  # the result is an object
    async with _node(env) as a, _node(env | {"TESSERA_NODE": "scheduler"}) as scheduler:
        job_id = await _submit(a.rt)
        async with _held(a, job_id) as held:
            await _dead_letter(scheduler.rt, held)  # deliveries ran out under a slow owner
            assert isinstance(a.rt.store, DirectoryStore)
            root = a.rt.store.root
            root.rename(root.with_name("objects-unmounted"))
            root.write_bytes(b"the volume is gone")  # the result write fails: retryable
            await held.release()

        ended = await _attempt_of(a, job_id)
        assert ended.outcome is AttemptOutcome.RETRYABLE, ended
        assert ended.ended_at is not None and ended.error_code == StoreUnavailable.code
        tile = await a.rt.db.get_tile(job_id, 0)
        assert tile is not None and tile.state is TileState.DEAD_LETTERED, "left as it was"
        assert a.count("tessera_retries_total", code=StoreUnavailable.code) == 1


# As in a worker process, where numpy warnings are not errors: the camera's NaN is the point.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
async def test_a_terminal_failure_after_the_tile_was_dead_lettered_still_ends_the_attempt(
    settings_env: dict[str, str], database_url: str
) -> None:
    env = _env(settings_env, "worker-a")
    scene = kernel.builtin_scene("spheres")
    scene["camera"]["up"] = [1e-200, 0, 0]  # validates, but the prepared camera is NaN
    async with _node(env) as a, _node(env | {"TESSERA_NODE": "scheduler"}) as scheduler:
        job_id = await _submit(a.rt, scene=scene)
        async with _held(a, job_id, in_pass=False) as held:
            await _dead_letter(scheduler.rt, held)
            await held.release()  # the scene is prepared, and refused: kernel_failure

        ended = await _attempt_of(a, job_id)
        assert ended.outcome is AttemptOutcome.TERMINAL, ended
        assert ended.ended_at is not None and ended.error_code == KernelFailure.code


async def test_a_hand_back_whose_checkpoint_is_fenced_ends_the_attempt_as_fenced(
    settings_env: dict[str, str], database_url: str
) -> None:
    slow = {"lease_ttl": "3600", "heartbeat_interval": "1800", "ack_wait": "7200"}
    async with _node(_env(settings_env, "worker-a", **slow)) as a:
        job_id = await _submit(a.rt, spp=8)  # two passes of 4
        async with _held(a, job_id) as held:
            first = await _attempt_of(a, job_id)
            await _expire_lease(a.rt.js, a.rt.names, job_id)
            owner = LeaseOwner(node="worker-b", attempt_id="b-attempt")
            lease = await a.rt.leases.acquire(n.lease_key_tile(job_id, 0), owner)
            assert lease is not None and lease.token > first.fence
            assert await a.rt.db.fence_tile(
                job_id, 0, token=lease.token, attempt_id="b-attempt", node="worker-b"
            ), "B takes the tile over"
            a.worker.handing_back.set()  # SIGTERM: A checkpoints its first pass to hand back
            await held.release()

        ended = await _attempt_of(a, job_id)
        assert ended.outcome is AttemptOutcome.FENCED, ended
        assert ended.ended_at is not None and ended.error_code == "fenced"


async def test_a_drain_whose_grace_runs_out_ends_the_attempt_as_handed_back(
    settings_env: dict[str, str], database_url: str
) -> None:
    async with _node(_env(settings_env, "worker-a", grace_period="0")) as a:
        job_id = await _submit(a.rt)
        job = await a.worker.job(job_id)
        assert job is not None
        await a.worker.scenes.get(job, a.worker.renderers["tessera"])
        gate = threading.Event()
        a.worker.kernels.executor.submit(gate.wait, 300)  # the pass cannot end in the grace
        stop = asyncio.Event()
        try:
            running = asyncio.create_task(a.worker.run(stop))
            await eventually(lambda: a.worker.kernels.running == 1, what="the pass waits")
            stop.set()  # SIGTERM with no grace left: the tile's task is cancelled mid-pass
            await asyncio.wait_for(running, 30)
        finally:
            gate.set()

        ended = await _attempt_of(a, job_id)
        assert ended.outcome is AttemptOutcome.HANDED_BACK, ended
        assert ended.ended_at is not None and ended.error_code == "grace_expired"


async def test_a_cancel_the_dead_lettered_tile_no_longer_allows_still_ends_the_attempt(
    settings_env: dict[str, str], database_url: str
) -> None:
    env = _env(settings_env, "worker-a")
    async with _node(env) as a, _node(env | {"TESSERA_NODE": "scheduler"}) as scheduler:
        job_id = await _submit(a.rt, spp=8)  # two passes of 4: a check between them
        async with _held(a, job_id) as held:
            await a.rt.db.request_cancel(job_id)  # the user cancels ...
            await _dead_letter(scheduler.rt, held)  # ... as the tile runs out of deliveries
            a.worker.cancelled[job_id] = None  # the job-cancelled event reaches the worker
            await held.release()

        ended = await _attempt_of(a, job_id)
        assert ended.outcome is AttemptOutcome.FENCED, ended
        assert ended.ended_at is not None and ended.error_code == IllegalTransition.code


# A kernel exception of a type nobody expected (numpy's RuntimeWarning raised as an error).
@pytest.mark.filterwarnings("error::RuntimeWarning")
async def test_an_unexpected_exception_still_ends_the_attempt(
    settings_env: dict[str, str], database_url: str
) -> None:
    scene = kernel.builtin_scene("spheres")
    scene["camera"]["up"] = [1e-200, 0, 0]  # its normalisation divides by zero
    async with _node(_env(settings_env, "worker-a")) as a:
        with warnings.catch_warnings():  # the gateway's validation, as in its own process
            warnings.simplefilter("ignore", RuntimeWarning)
            job_id = await _submit(a.rt, scene=scene)
        async with _held(a, job_id, in_pass=False) as held:
            with pytest.raises(RuntimeWarning):  # re-raised: consume logs "handler crashed"
                await held.release()

        ended = await _attempt_of(a, job_id)
        assert ended.outcome is AttemptOutcome.RETRYABLE, ended
        assert ended.ended_at is not None and ended.error_code == "internal"
        assert "RuntimeWarning" in (ended.error or "")
