"""Least privilege: every service works under its own NATS user, and nothing more."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import nats.errors
import pytest

from proto import names as n
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.core.errors import StoreUnavailable
from shared.devstack import natsauth
from shared.devstack.procs import free_port
from shared.nats.jetstream import connect_nats, redact_url
from shared.objectstore import ObjectStore
from tests.deploy.conftest import REPO, AuthNats
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, result_bytes, settle, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually

VIOLATION = "PERMISSIONS VIOLATION"


async def test_a_job_completes_with_every_service_under_its_own_user(
    auth_services: ServiceProcesses, auth_client: TesseraClient, objects: ObjectStore
) -> None:
    auth_services.start_all(workers=1, scheduler_first=True)
    body = request()
    reply = await submit(auth_client, body)
    status = await settle(auth_client, reply["job_id"], auth_services)
    assert await result_bytes(objects, status) == reference_png(body)
    logs = {name: p.log_path.read_text() for name, p in auth_services.procs.items()}
    assert not [name for name, text in logs.items() if VIOLATION in text], auth_services.logs()


async def test_the_gateway_serves_the_console_verbs_under_its_own_user(
    auth_services: ServiceProcesses, auth_client: TesseraClient
) -> None:
    scheduler = auth_services.start("scheduler")  # declares the topology, then goes away
    auth_services.wait_started(scheduler)
    scheduler.stop()
    auth_services.wait_started(auth_services.start("gateway"))
    job_id = (await submit(auth_client, request()))["job_id"]  # its JOBS message stays pending
    farm = await auth_client.farm()  # reads the pending message's age: a leader read of JOBS
    assert farm["oldest_age_s"] >= 0 and farm["dlq_size"] == 0
    assert (await auth_client.workers())["workers"] == []
    assert (await auth_client.job_timeline(job_id))["events"]
    assert (await auth_client.job_tiles(job_id))["tiles"] == []
    assert (await auth_client.job_preview(job_id, max_edge=16))["tiles_total"] == 0
    log = auth_services.procs["gateway"].log_path.read_text()
    assert VIOLATION not in log, auth_services.logs()


def _violations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if VIOLATION in r.getMessage()]


async def test_a_worker_cannot_call_the_api_and_a_denial_is_logged_loudly(
    auth_nats: AuthNats, e2e_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="shared.nats.jetstream")
    names = n.Names(e2e_settings.deployment.namespace)
    nc = await auth_nats.connect("worker", e2e_settings)
    try:
        for verb in (n.ApiVerb.DLQ_REQUEUE, n.ApiVerb.SUBMIT):
            with pytest.raises(nats.errors.TimeoutError):  # a denial looks like a time-out
                await nc.request(names.api_subject(verb), b"{}", timeout=0.5)
        await nc.publish(f"$JS.API.STREAM.DELETE.{names.stream(n.STREAM_TILES)}", b"")
        await nc.publish(names.jobs_subjects.replace(">", "x"), b"")  # only the gateway's
        found = await eventually(
            lambda: _violations(caplog) if len(_violations(caplog)) >= 4 else None,
            what="four denials logged",
        )
    finally:
        await nc.close()
    assert all(r.levelno == logging.ERROR for r in caplog.records if VIOLATION in r.getMessage())
    text = "\n".join(found).lower()  # nats-py lower-cases the server's message
    assert names.api_subject(n.ApiVerb.DLQ_REQUEUE).lower() in text
    assert f"stream.delete.{names.stream(n.STREAM_TILES)}".lower() in text


async def test_a_client_cannot_read_the_lease_bucket(
    auth_services: ServiceProcesses,
    auth_nats: AuthNats,
    e2e_settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth_services.wait_started(auth_services.start("scheduler"))  # the buckets exist
    caplog.set_level(logging.ERROR, logger="shared.nats.jetstream")
    names = n.Names(e2e_settings.deployment.namespace)
    bucket = names.bucket(n.BUCKET_LEASES)
    nc = await auth_nats.connect("client", e2e_settings)
    try:
        js = nc.jetstream(timeout=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await js.get_msg(f"KV_{bucket}", subject=f"$KV.{bucket}.tile.x.0")
        await nc.subscribe(f"$KV.{bucket}.>")
        await eventually(lambda: len(_violations(caplog)) >= 2, what="both denials logged")
    finally:
        await nc.close()
    text = "\n".join(_violations(caplog)).lower()
    assert f"stream.msg.get.kv_{bucket}".lower() in text and "subscription" in text


def test_every_user_has_exactly_its_own_consumers_and_the_owner_alone_declares() -> None:
    perms = natsauth.permissions(n.Names())
    nexts = {
        role: sorted(s.split(".", 5)[-1] for s in p.publish if ".MSG.NEXT." in s)
        for role, p in perms.items()
    }
    assert nexts == {
        "gateway": [],
        "scheduler": ["ADVISORIES.scheduler-advisories", "JOBS.scheduler-jobs"],
        "worker": ["TILES.workers", "TILES.workers-blender", "TILES.workers-povray"],
        "finalizer": ["EVENTS.finalizer"],
        "web": [],
        "client": [],
    }
    creators = {r for r, p in perms.items() if any(".STREAM.CREATE." in s for s in p.publish)}
    assert creators == {"scheduler"}
    every = natsauth.permissions(n.Names(), topology_owner=None)
    assert {r for r, p in every.items() if "$JS.API.STREAM.CREATE.TILES" in p.publish} == set(
        natsauth.SERVICE_ROLES
    )
    assert not any(".DELETE." in s for p in perms.values() for s in p.publish if "MSG" not in s)
    assert perms["client"].publish == ("tessera.api.>",)
    # the web console: the API verbs it exposes, one by one, and the events; no JetStream API
    assert all(s.startswith("tessera.api.") and "*" not in s and ">" not in s
               for s in perms["web"].publish)  # fmt: skip
    assert perms["web"].subscribe == ("_INBOX.>", "tessera.events.>")


def test_the_committed_server_config_is_the_generated_one() -> None:
    refs = {r: natsauth.EnvRef(f"TESSERA_NATS_PASSWORD_{r.upper()}") for r in natsauth.ROLES}
    committed = (REPO / "deploy" / "nats" / "tessera-auth.conf").read_text()
    assert committed == natsauth.render_config(refs), (
        "regenerate deploy/nats/tessera-auth.conf: python -m shared.devstack.natsauth > ..."
    )


async def test_credentials_stay_out_of_errors_and_logs(
    e2e_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"nats://worker:s3cret-pw@127.0.0.1:{free_port()}"  # nothing listens there
    assert redact_url(url) == url.replace("s3cret-pw", "***")
    env = e2e_settings.to_env() | {"TESSERA_NATS_URL": url}
    with pytest.raises(StoreUnavailable) as failed:
        await connect_nats(Settings.from_env(env), name="test", connect_within=1)
    assert "s3cret-pw" not in str(failed.value) and "worker:***@" in str(failed.value)
    assert "s3cret-pw" not in caplog.text


async def test_the_web_console_works_as_its_user_and_may_do_nothing_else(
    auth_services: ServiceProcesses,
    auth_nats: AuthNats,
    e2e_settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth_services.wait_started(auth_services.start("scheduler"))
    auth_services.wait_started(auth_services.start("gateway"))
    port, token = free_port(), "operator-token-for-the-auth-test"
    web = auth_services.start(
        "web", env={"TESSERA_WEB_PORT": str(port), "TESSERA_WEB_TOKEN": f"operator:{token}"}
    )
    auth_services.wait_started(web)
    base, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(f"{base}/api/events") as stream,  # it hears events as its user
    ):
        assert await stream.content.readline() == b"retry: 2000\n"
        async with http.post(f"{base}/api/jobs", json=request()) as submitted:
            assert submitted.status == 201, await submitted.text()
            job = (await submitted.json())["job_id"]
        async with http.post(f"{base}/api/jobs/{job}/cancel") as cancelled:
            assert cancelled.status == 200, await cancelled.text()
        line = b""
        while not line.startswith(b"event: job-cancelled"):
            line = await asyncio.wait_for(stream.content.readline(), 10)
    caplog.set_level(logging.ERROR, logger="shared.nats.jetstream")
    names = n.Names(e2e_settings.deployment.namespace)
    nc = await auth_nats.connect("web", e2e_settings)
    try:  # no JetStream API, no KV, no events of its own
        await nc.publish(f"$JS.API.STREAM.INFO.{names.stream(n.STREAM_JOBS)}", b"")
        await nc.publish(names.event_subject(job, n.EventKind.JOB_COMPLETED), b"")
        await eventually(lambda: len(_violations(caplog)) >= 2, what="both denials logged")
    finally:
        await nc.close()
    assert VIOLATION not in web.log_path.read_text(), auth_services.logs()
