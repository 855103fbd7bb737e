"""Gateway burst benchmark (not a test): status latency while a burst of large submits lands.

Run: ``python -m bench.gateway_burst`` (add ``--requests N`` to change the burst). On the
embedded stack (NATS, PostgreSQL), with the gateway as its own process, one client fires
``--requests`` submits of a ~57 KB scene (1,025 spheres: parseable, refused ``invalid`` by the
kernel's 1,024-sphere limit) all at once, while a second client asks for one job's ``status``
every 20 ms. Printed per gateway: status latency p50/p99/max during the burst, how many status
requests got ``no responders`` or no answer, how the burst's submits were answered (``invalid``,
``busy``, no responders, timeout), and whether nats-server logged a slow consumer or the gateway
a disconnect.

Two gateways are measured side by side in one run:

- ``shedding``: the gateway as shipped (bounded intake, ``busy`` when full, pending limits sized
  to the intake, large bodies decoded off the event loop);
- ``legacy``: the same code with the behaviour before issue 14 (a full intake waits, leaving
  requests in the client library's buffer; default pending limits; every body decoded on the
  loop).

The burst is fired from a process of its own (its own event loop and connection), and status
samples count only while it is being fired, so status latency is the gateway's, not this
process's time writing 114 MB. Each status carries its send time in a header; the gateway (in
``--serve`` mode) notes when its loop read it and when the reply was ready, and the "status legs"
line splits latency into to / in / back from the gateway (``time.monotonic()`` is one clock for
every process on the host).

Measured on the 2-core development box shared with other test runs, 2,000 submits, two runs of
both modes (load average 4.5 at the start of the first, 5.5 at the end of the second):

- run 1: legacy cut as a slow consumer ("MaxPending of 67108864 Exceeded"); status 1,004 ok,
  452 no responders, p50 3 ms, p99 19 ms, max 1.45 s; submits 653 invalid, 783 no responders,
  564 timed out, 33.0 s. Shedding: the gateway's first reply only after 2.0 s, and its submit
  connection was cut too (202 no responders, 669 timed out, 1,099 busy, 30 invalid, 34.2 s);
  its status connection was not: 1,449 of 1,449 ok, p50 4 ms, p99 86 ms, max 183 ms.
- run 2: legacy cut; status 1,006 ok, 395 no responders, p50 3 ms, p99 19 ms, max 3.3 s; 34.3 s.
  Shedding: no slow consumer; status 100 of 100 ok, p50 17 ms, p99 = max 68 ms (legs: to the
  gateway max 32 ms, in it max 46 ms, back max 21 ms); submits 33 invalid, 1,967 busy, 2.8 s.

Before the second connection (same bench, shedding only, load average ~2): status p99 = max
217, 318 and 577 ms over 33-36 samples, nearly all of it "to the gateway" (210, 295, 569 ms:
waiting behind the burst's bytes on the one connection); with it, three runs: max 102, 57 and
54 ms over 59-68 samples, p50 9-16 ms instead of 2-7 ms (statuses now reach a loop busy with
the burst rather than waiting until it is done). Before this bench fired from its own process:
42 samples, p50 6 ms, p99 = max 831 ms, most of it this process's loop sending the burst. A full
garbage collection over the start-up heap held the gateway's loop 0.15-0.5 s mid-burst until
the gateway froze it; the checker process's spawn and imports now happen at gateway start.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import DEFAULT_SUB_PENDING_BYTES_LIMIT, DEFAULT_SUB_PENDING_MSGS_LIMIT

import kernel
from proto.api import SubmitRequest
from proto.names import ApiVerb, Names
from services.client.api import TesseraClient
from services.gateway.app import Gateway, freeze_heap
from services.gateway.intake import Intake, Lane, T
from shared.core.config import Settings
from shared.devstack.procs import ManagedProcess, wait_for
from shared.devstack.stack import Stack
from shared.nats.jetstream import connect_nats
from shared.service.runtime import Runtime, service_main

__all__ = ["BurstResult", "LegacyGateway", "big_scene", "run_burst"]

STATUS_EVERY = 0.02
SPHERES = 1025
#: what nats-server and the gateway log when a connection is dropped under load
TROUBLE = ("Slow Consumer", "slow consumer", "disconnected", "SlowConsumer")
#: header of a status request: ``time.monotonic()`` when the bench sent it
SENT_HEADER = "Bench-Sent"
_READ_HEADER = "Bench-Read"


def big_scene() -> dict[str, Any]:
    """A ~57 KB scene document with 1,025 spheres: one more than the kernel accepts."""
    doc = kernel.builtin_scene("cornell")
    white = "white"
    doc["spheres"] = [
        {"center": [float(i % 32), float(i // 32), 50.5], "radius": 0.25, "material": white}
        for i in range(SPHERES)
    ]
    return doc


class _InlineIntake(Intake):
    """One lane; every body checked on the loop; nats-py's default pending limits."""

    def lane_for(self, size: int) -> Lane:
        return self.small

    def start(self, *modules: str) -> None:
        pass  # no worker process

    def pending_limits(self, max_payload: int) -> tuple[int, int]:
        return DEFAULT_SUB_PENDING_MSGS_LIMIT, DEFAULT_SUB_PENDING_BYTES_LIMIT

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)


class _WaitingLane(Lane):
    def __init__(self, in_flight: int) -> None:
        super().__init__("all", in_flight, in_flight)
        self.free = asyncio.Semaphore(in_flight)

    def release(self, seconds: float) -> None:
        super().release(seconds)
        self.free.release()


class LegacyGateway(Gateway):
    """The gateway as it was before issue 14, for the side-by-side comparison.

    A request arriving while all 64 places are busy waits for one (so further requests pile up
    in the client library's buffer and in nats-server's outbound buffer); subscriptions keep
    nats-py's default pending limits; every body is decoded on the event loop; every verb is
    served on the service's one connection.
    """

    def __init__(self, rt: Runtime) -> None:
        intake = _InlineIntake()
        self.lane = intake.small = _WaitingLane(64)
        super().__init__(rt, intake=intake)

    async def _connect_small(self) -> NATS:
        return self.rt.nc  # one connection for every verb

    async def _on_msg(self, msg: Msg, nc: NATS) -> None:
        await self.lane.free.acquire()
        self.lane.in_use += 1
        self._spawn(msg, self.lane, nc)


@dataclass
class BurstResult:
    """What one burst did (status samples only from while the burst was being fired)."""

    submits: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    status_latency: list[float] = field(default_factory=list)
    burst_seconds: float = 0.0
    #: ``time.monotonic()`` when the burst started (one clock for every process on the host)
    t0: float = 0.0
    #: (seconds after the burst started, latency) of every status answered ok
    status_timeline: list[tuple[float, float]] = field(default_factory=list)
    #: (seconds after the burst started, outcome) of every submit reply
    submit_timeline: list[tuple[float, str]] = field(default_factory=list)
    #: ``time.monotonic()`` when each status of ``status_latency`` was sent
    status_sent: list[float] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of status latency in seconds (nan if none answered)."""
        if not self.status_latency:
            return float("nan")
        ordered = sorted(self.status_latency)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class _Fired:
    """What the burst process reports: its start and end, and each reply's time and outcome."""

    started: float
    ended: float
    replies: list[tuple[float, str]]


def _outcome(data: bytes) -> str:
    body = orjson.loads(data)
    return "ok" if body.get("ok") else str(body["error"]["code"])


async def _one(
    nc: NATS, subject: str, data: bytes, wait: float, headers: dict[str, str] | None = None
) -> str:
    try:
        msg = await nc.request(subject, data, timeout=wait, headers=headers)
    except nats.errors.NoRespondersError:
        return "no_responders"
    except (TimeoutError, nats.errors.TimeoutError):
        return "timeout"
    except nats.errors.Error as exc:
        return type(exc).__name__
    return _outcome(msg.data)


def _fire(settings: Settings, subject: str, requests: int, wait: float) -> _Fired:
    """In the burst process: send ``requests`` large submits at once, wait for every reply."""
    return asyncio.run(_fire_all(settings, subject, requests, wait))


async def _fire_all(settings: Settings, subject: str, requests: int, wait: float) -> _Fired:
    body = SubmitRequest(project="bench", scene=big_scene(), width=64, height=48, spp=1).to_body()
    data = orjson.dumps(body)
    nc = await connect_nats(settings, name="bench-burst")
    replies: list[tuple[float, str]] = []

    async def timed() -> None:
        outcome = await _one(nc, subject, data, wait)
        replies.append((time.monotonic(), outcome))

    try:
        started = time.monotonic()
        await asyncio.gather(*(timed() for _ in range(requests)))
        return _Fired(started, time.monotonic(), replies)
    finally:
        await nc.close()


async def _poll_status(
    nc: NATS, names: Names, job_id: str, stop: asyncio.Event
) -> list[tuple[float, float, str]]:
    """Ask for a status every 20 ms until ``stop``: (sent, latency, outcome) of each."""
    subject = names.api_subject(ApiVerb.STATUS)
    data = orjson.dumps({"job_id": job_id})
    samples: list[tuple[float, float, str]] = []
    while not stop.is_set():
        started = time.monotonic()
        outcome = await _one(nc, subject, data, 5.0, headers={SENT_HEADER: repr(started)})
        samples.append((started, time.monotonic() - started, outcome))
        await asyncio.sleep(max(0.0, STATUS_EVERY - (time.monotonic() - started)))
    return samples


async def run_burst(
    settings: Settings,
    status_nc: NATS,
    names: Names,
    *,
    requests: int,
    wait: float = 30.0,
    own_process: bool = True,
) -> BurstResult:
    """Fire ``requests`` large submits at once while ``status_nc`` polls a status every 20 ms.

    With ``own_process`` the burst has a process and connection (``settings``) of its own, so
    the status latency measured here is the gateway's, not this event loop's time sending the
    burst's bytes, and the burst goes out as fast as one process can send. Without it, the
    burst's own connection is served by this event loop, beside the status poller: one client
    sending as fast as it can (issue 14's reproduction, and the test's).
    """
    client = TesseraClient(status_nc, names, timeout=10)
    job = await client.submit(
        SubmitRequest(project="bench", scene="cornell", width=16, height=16, spp=1)
    )
    stop = asyncio.Event()
    poller = asyncio.create_task(_poll_status(status_nc, names, job["job_id"], stop))
    subject = names.api_subject(ApiVerb.SUBMIT)
    spawn = multiprocessing.get_context("spawn")
    try:
        if own_process:
            with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                loop = asyncio.get_running_loop()
                fired = await loop.run_in_executor(pool, _fire, settings, subject, requests, wait)
        else:
            fired = await _fire_all(settings, subject, requests, wait)
    finally:
        stop.set()
        samples = await poller
    result = BurstResult(t0=fired.started, burst_seconds=fired.ended - fired.started)
    for sent, latency, outcome in samples:
        if fired.started <= sent <= fired.ended:
            result.statuses[outcome] += 1
            if outcome == "ok":
                result.status_latency.append(latency)
                result.status_sent.append(sent)
                result.status_timeline.append((sent - fired.started, latency))
    result.submits.update(outcome for _, outcome in fired.replies)
    result.submit_timeline = [(at - fired.started, what) for at, what in fired.replies]
    return result


class _Timed(Gateway):
    """Notes when the gateway's loop read each bench status request and when it had the reply."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        #: (sent by the bench, read by the gateway, reply ready) per status request
        self.timings: list[tuple[float, float, float]] = []

    async def _on_msg(self, msg: Msg, nc: NATS) -> None:
        if msg.headers is not None and SENT_HEADER in msg.headers:
            msg.headers[_READ_HEADER] = repr(time.monotonic())
        await super()._on_msg(msg, nc)

    async def dispatch(self, subject: str, data: bytes, headers: Mapping[str, str] | None) -> bytes:
        reply = await super().dispatch(subject, data, headers)
        if headers is not None and _READ_HEADER in headers:
            sent, read = float(headers[SENT_HEADER]), float(headers[_READ_HEADER])
            self.timings.append((sent, read, time.monotonic()))
        return reply


class _TimedLegacy(_Timed, LegacyGateway):
    pass


def _serve(mode: str) -> int:
    cls = _TimedLegacy if mode == "legacy" else _Timed

    async def body(rt: Runtime, stop: asyncio.Event) -> None:
        gateway = cls(rt)
        if mode != "legacy":
            freeze_heap()
        await gateway.start()
        try:
            await stop.wait()
        finally:
            await gateway.stop(rt.settings.process.grace_period)
            rt.log.info("bench status timings", timings=gateway.timings)

    return service_main("gateway", body)


def _trouble(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(t in line for t in TROUBLE)]


async def _measure(stack: Stack, mode: str, requests: int, log_dir: Path) -> None:
    namespace = f"bench{mode}{os.getpid()}"
    env = stack.env() | {"TESSERA_NAMESPACE": namespace, "TESSERA_NODE": f"gw-{mode}"}
    env |= {"TESSERA_DATABASE_URL": stack.postgres.dsn, "TESSERA_LOG_LEVEL": "INFO"}
    env |= {"TESSERA_OBJECT_STORE": f"file://{stack.objects_dir}"}
    argv = [sys.executable, "-m", "bench.gateway_burst", "--serve", mode]
    proc = ManagedProcess(
        f"gateway-{mode}", argv, log_dir / f"gateway-{mode}.log", env=os.environ | env
    )
    nats_log = stack.nats.proc
    nats_start = len(nats_log.log_since_start())
    proc.start()
    try:
        wait_for(
            lambda: '"msg":"gateway listening"' in proc.log_since_start(),
            timeout=60,
            what="the gateway did not start",
            proc=proc,
        )
        settings = Settings.from_env(env, database=False)
        status_nc = await connect_nats(settings, name="bench-status")
        try:
            result = await run_burst(settings, status_nc, Names(namespace), requests=requests)
        finally:
            await status_nc.close()
    finally:
        proc.stop()
    log = proc.log_since_start()
    trouble = _trouble(nats_log.log_since_start()[nats_start:]) + _trouble(log)
    _report(mode, requests, result, trouble)
    _report_legs(result, _timings(log))


def _timings(log: str) -> dict[float, tuple[float, float]]:
    """The gateway's (read, reply ready) per status request, by the time the bench sent it."""
    for line in log.splitlines():
        if '"msg":"bench status timings"' in line:
            return {sent: (read, done) for sent, read, done in orjson.loads(line)["timings"]}
    return {}


def _report_legs(r: BurstResult, timings: dict[float, tuple[float, float]]) -> None:
    legs: dict[str, list[float]] = {"to the gateway": [], "in the gateway": [], "back": []}
    for sent, latency in zip(r.status_sent, r.status_latency, strict=True):
        if sent in timings:
            read, done = timings[sent]
            legs["to the gateway"].append(read - sent)
            legs["in the gateway"].append(done - read)
            legs["back"].append(sent + latency - done)
    parts = []
    for leg, values in legs.items():
        ordered = sorted(values) or [float("nan")]
        p50 = ordered[len(ordered) // 2]
        parts.append(f"{leg} p50 {p50 * 1000:.0f} ms max {ordered[-1] * 1000:.0f} ms")
    print(f"{'':>11}status legs ({len(legs['back'])} matched): {'; '.join(parts)}")


def _report(mode: str, requests: int, r: BurstResult, trouble: list[str]) -> None:
    print(
        f"{mode:>9}: {requests} submits in {r.burst_seconds:.1f} s; status p50 "
        f"{r.percentile(0.5) * 1000:.0f} ms, p99 {r.percentile(0.99) * 1000:.0f} ms, max "
        f"{max(r.status_latency, default=float('nan')) * 1000:.0f} ms over "
        f"{sum(r.statuses.values())} requests"
    )
    print(f"{'':>11}status outcomes {dict(r.statuses)}; submit outcomes {dict(r.submits)}")
    print(f"{'':>11}slow-consumer/disconnect log lines: {len(trouble)}")
    slow = sorted(r.status_timeline, key=lambda x: -x[1])[:3]
    sent = ", ".join(f"{lat * 1000:.0f} ms sent at {at:.2f} s" for at, lat in slow)
    first = {what: f"{at:.2f} s" for at, what in reversed(sorted(r.submit_timeline))}
    print(f"{'':>11}slowest status: {sent}; first submit reply of each kind at {first}")
    for line in trouble[:4]:
        print(f"{'':>13}{line[:160]}")


async def _main(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="tessera-bench-burst-") as tmp,
        Stack(Path(tmp) / "stack", durable=False) as stack,
    ):
        for mode in args.modes:
            await _measure(stack, mode, args.requests, Path(tmp) / "logs")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--serve``, be the gateway process it measures)."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_burst", description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="submits in the burst")
    parser.add_argument("--modes", nargs="+", default=["legacy", "shedding"],
                        choices=["legacy", "shedding"], help="gateways to measure")  # fmt: skip
    parser.add_argument("--serve", choices=["legacy", "shedding"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return _serve(args.serve)
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
