"""Load shedding and payload limits: the gateway answers ``busy`` instead of being cut off.

The burst test runs the gateway as its own process (as deployed) and fires the burst of issue 14
at it: 2,000 submits of a ~57 KB scene (1,025 spheres: parseable, refused by the kernel) at once
from one client, while a second client asks for a status every 20 ms. Before the intake, the
gateway fell behind, nats-server cut it as a slow consumer (MaxPending of 64 MiB) and requests got
"no responders" until it reconnected. Latency figures are in ``python -m bench.gateway_burst``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import nats
import orjson
import pytest
from nats.aio.client import Client as NATS

from bench.gateway_burst import TROUBLE, big_scene, run_burst
from proto.api import SubmitRequest
from proto.limits import MAX_REQUEST_BYTES, NATS_MAX_PAYLOAD, NATS_MAX_PENDING
from proto.names import ApiVerb, Names
from proto.replies import ApiError, ErrorCode
from services.cli.local import ServiceProcesses
from services.client.api import RequestTooLarge, TesseraClient
from services.client.session import EXIT_UNAVAILABLE, EXIT_USAGE, exit_status
from services.gateway.app import LARGE_VERBS, Gateway
from services.gateway.intake import Intake
from shared.core import pauses
from shared.core.config import Settings
from shared.devstack import natsauth
from shared.devstack.stack import HOST, NatsServer, Stack
from shared.nats.jetstream import connect_nats
from shared.service.runtime import Runtime
from tests.gateway.conftest import body, raw_request
from tests.helpers import eventually

BURST = 2000


@pytest.mark.parametrize("own_process", [False, True], ids=["one-client", "own-process"])
async def test_a_burst_of_large_submits_is_shed_not_disconnected(
    stack: Stack,
    settings_env: dict[str, str],
    database_url: str,
    tmp_path: Path,
    own_process: bool,
) -> None:
    """Issue 14's burst, from one client sending as fast as its event loop can, and from a
    process of its own (as fast as one process can send: on a starved box that out-sends the
    gateway's reading, which ``max_pending`` (proto.limits.NATS_MAX_PENDING) absorbs)."""
    procs = ServiceProcesses(settings_env, tmp_path / "logs")
    nats_log = stack.nats.proc
    before = len(nats_log.log_since_start())
    gateway = procs.start("gateway")
    try:
        procs.wait_started(gateway)
        settings = Settings.from_env(settings_env)
        status_nc = await connect_nats(settings, name="test-status")
        try:
            result = await run_burst(
                settings,
                status_nc,
                Names(settings.deployment.namespace),
                requests=BURST,
                own_process=own_process,
            )
        finally:
            await status_nc.close()
        assert gateway.alive(), procs.logs()
    finally:
        procs.stop_all()
    server_lines = nats_log.log_since_start()[before:].splitlines()
    trouble = [ln for ln in server_lines if "Slow Consumer" in ln and "gateway" in ln]
    trouble += [
        ln for ln in gateway.log_since_start().splitlines() if any(t in ln for t in TROUBLE)
    ]
    assert trouble == [], "\n".join(trouble[:5])
    assert result.statuses["no_responders"] == 0, result.statuses
    assert set(result.statuses) == {"ok"}, result.statuses
    assert result.submits["no_responders"] == result.submits["timeout"] == 0, result.submits
    assert set(result.submits) <= {"invalid", "busy"} and result.submits["invalid"] > 0
    assert sum(result.submits.values()) == BURST


async def test_a_full_lane_answers_busy_with_a_retry_after_hint(
    runtime: Runtime, nc: NATS, names: Names
) -> None:
    gw = Gateway(runtime, intake=Intake(in_flight=0, large_in_flight=0))
    await gw.start()
    try:
        reply = await raw_request(nc, names, ApiVerb.STATUS, orjson.dumps({"job_id": "j"}))
        assert reply["ok"] is False and reply["error"]["code"] == "busy"
        assert 0.05 <= reply["error"]["retry_after"] <= 5.0
        client = TesseraClient(nc, names, timeout=0.5)
        with pytest.raises(ApiError) as info:  # retried with the hint until the timeout
            await client.status("j")
        assert info.value.error_code is ErrorCode.BUSY and info.value.retry_after is not None
        assert exit_status(info.value) == EXIT_UNAVAILABLE
        assert gw.rt.metrics.gateway_busy.labels(lane="small")._value.get() >= 2
    finally:
        await gw.stop(5.0)


async def test_large_scenes_are_checked_in_a_worker_process(
    gateway: Gateway, client: TesseraClient, nc: NATS, names: Names
) -> None:
    refused = await raw_request(nc, names, ApiVerb.SUBMIT, orjson.dumps(body(scene=big_scene())))
    assert refused["error"]["code"] == "invalid" and "1024" in refused["error"]["message"]
    scene = big_scene()
    scene["spheres"] = scene["spheres"][:1024]
    reply = await client.submit(
        SubmitRequest(project="gw", scene=scene, width=64, height=48, spp=1)
    )
    assert reply["created"] is True and reply["state"] == "queued"


async def test_the_server_accepts_every_body_within_the_limits(
    gateway: Gateway, nc: NATS, names: Names
) -> None:
    """max_payload is the shared constant, so an oversize body reaches the gateway: ``invalid``."""
    assert nc.max_payload == NATS_MAX_PAYLOAD > MAX_REQUEST_BYTES
    data = orjson.dumps(body(project="x" * MAX_REQUEST_BYTES))
    reply = await raw_request(nc, names, ApiVerb.SUBMIT, data)
    assert reply["error"]["code"] == "invalid"
    assert f"{len(data)} bytes exceeds the limit {MAX_REQUEST_BYTES}" in reply["error"]["message"]


async def test_the_client_refuses_a_body_above_a_smaller_servers_max_payload(
    server_dir: Path,
) -> None:
    """Against a NATS server left at 1 MiB: RequestTooLarge before sending, a usage error."""
    config = server_dir / "small.conf"
    config.write_text(natsauth.render_limits(1024 * 1024))
    server = NatsServer(server_dir / "nats", config_file=config)
    server.start()
    try:
        nc = await nats.connect(server.url)
        try:
            client = TesseraClient(nc, Names("t"), timeout=1)
            scene = {"blob": "x" * (1024 * 1024)}
            with pytest.raises(RequestTooLarge, match="max_payload of 1048576 bytes"):
                await client.call(ApiVerb.SUBMIT, {"project": "p", "scene": scene})
            assert exit_status(RequestTooLarge("x")) == EXIT_USAGE
        finally:
            await nc.close()
    finally:
        server.stop()


async def test_the_checker_process_is_warm_before_the_first_large_submit(
    runtime: Runtime,
) -> None:
    """start() spawns the worker and imports the kernel there: no request pays for it."""
    gw = Gateway(runtime)
    await gw.start()
    try:
        assert gw.intake.warm is not None
        await asyncio.wait_for(gw.intake.warm, timeout=60)  # bound, not a timing assertion
        pool = gw.intake._pool
        assert pool is not None and len(pool._processes) == 1
        assert all(p.is_alive() for p in pool._processes.values())
    finally:
        await gw.stop(5.0)
    assert gw.intake._pool is None


async def _connz(stack: Stack) -> dict[str, Any]:
    url = f"http://{HOST}:{stack.nats.monitor_port}/connz?subs=1&limit=1024"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        connz: dict[str, Any] = await response.json()
    return connz


async def _api_subscriptions(stack: Stack, names: Names) -> dict[str, set[str]]:
    """Connection name -> the API subjects it subscribes to, from nats-server's ``/connz``."""
    connz = await _connz(stack)
    api = {names.api_subject(verb) for verb in ApiVerb}
    found: dict[str, set[str]] = {}
    for conn in connz["connections"]:
        subjects = set(conn.get("subscriptions_list", [])) & api
        if subjects:
            found.setdefault(conn.get("name", ""), set()).update(subjects)
    return found


async def test_the_small_verbs_are_served_on_a_connection_of_their_own(
    runtime: Runtime, stack: Stack, nc: NATS, names: Names
) -> None:
    """A status must not wait behind a burst's bytes on the submits' connection."""
    gw = Gateway(runtime)
    await gw.start()
    node = runtime.settings.node
    large = {names.api_subject(verb) for verb in LARGE_VERBS}  # submit, asset chunk/manifest
    assert names.api_subject(ApiVerb.SUBMIT) in large
    try:
        subs = await _api_subscriptions(stack, names)
        small = {names.api_subject(verb) for verb in ApiVerb} - large
        assert subs == {f"gateway:{node}": large, f"gateway:{node}:small": small}
        assert gw.small_nc is not None and gw.small_nc is not runtime.nc
        reply = await raw_request(nc, names, ApiVerb.STATUS, orjson.dumps({"job_id": "nope"}))
        assert reply["error"]["code"] == "not_found"  # answered on the connection it came by
    finally:
        await gw.stop(5.0)
    assert gw.small_nc is None

    async def small_closed() -> bool:
        connz = await _connz(stack)
        return all(c.get("name") != f"gateway:{node}:small" for c in connz["connections"])

    await eventually(small_closed, what="the second connection closed at stop")


async def test_the_server_buffers_a_whole_burst_for_a_lagging_connection(stack: Stack) -> None:
    """max_pending is the shared constant (a 2,000-submit burst of 57 KB fits whole)."""
    url = f"http://{HOST}:{stack.nats.monitor_port}/varz"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        varz: dict[str, Any] = await response.json()
    assert varz["max_pending"] == NATS_MAX_PENDING > BURST * 57_000


async def test_a_large_body_for_a_verb_other_than_submit_is_refused_unread(
    gateway: Gateway, nc: NATS, names: Names
) -> None:
    """Only a submit carries an inline scene; a 1 MiB status is refused before any parsing and
    takes no place in the large lane."""
    data = orjson.dumps({"job_id": "x" * (1024 * 1024)})
    before = gateway.intake.large.in_use
    reply = await raw_request(nc, names, ApiVerb.STATUS, data)
    assert reply["error"]["code"] == "invalid"
    assert "only submit takes a body" in reply["error"]["message"]
    assert gateway.intake.large.in_use == before


async def test_requests_read_before_a_stop_are_still_answered(
    runtime: Runtime, stack: Stack, nc: NATS, names: Names
) -> None:
    """The gateway drains its subscriptions on stop: requests already in the client library's
    buffer are answered, not dropped (their clients would wait out their whole timeout)."""
    gw = Gateway(runtime)
    await gw.start()
    held, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:  # the first request holds the callback; the rest queue behind it
        if not held.is_set():
            held.set()
            await release.wait()

    subject = names.api_subject(ApiVerb.STATUS)
    data = orjson.dumps({"job_id": "unknown-job"})
    with pauses.installed("gateway.received", hold):
        replies = [asyncio.ensure_future(nc.request(subject, data, timeout=20)) for _ in range(10)]
        await nc.flush()
        await asyncio.wait_for(held.wait(), 10)
        stopping = asyncio.ensure_future(gw.stop(10.0))

        async def unsubscribed() -> bool:  # the server has dropped the gateway's interest
            subs = await _api_subscriptions(stack, names)
            return not any(subject in subjects for subjects in subs.values())

        await eventually(unsubscribed, timeout=20, what="the stop unsubscribed from status")
        release.set()
        await asyncio.wait_for(stopping, 30)
    answered = await asyncio.gather(*replies, return_exceptions=True)
    codes = [
        r if isinstance(r, BaseException) else orjson.loads(r.data)["error"]["code"]
        for r in answered
    ]
    assert codes == ["not_found"] * 10, codes
