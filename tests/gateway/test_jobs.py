"""status, list, cancel, retry; a raising handler; the service body's start and stop."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NATS

from proto.api import SubmitRequest
from proto.api_replies import StatusReply
from proto.messages import JobEvent, JobMessage
from proto.names import STREAM_EVENTS, STREAM_JOBS, ApiVerb, EventKind, Names, new_job_id
from proto.replies import ApiError
from services.client.api import TesseraClient
from services.gateway.app import Gateway, run
from shared.core.lifecycle import JobTrigger
from shared.service.runtime import Runtime
from tests.gateway.conftest import body, jobs_messages, raw_request
from tests.helpers import eventually


async def _submit(client: TesseraClient, **overrides: object) -> str:
    reply = await client.submit(SubmitRequest(**body(**overrides)))
    job_id: str = reply["job_id"]
    return job_id


async def test_status_reports_progress_fields(gateway: Gateway, client: TesseraClient) -> None:
    job_id = await _submit(client)
    status = await client.status(job_id)
    assert status["job_id"] == job_id and status["state"] == "queued"
    assert status["tiles_done"] == 0 and status["samples_done"] == 0
    assert status["generation"] == 0 and status["cancel_requested"] is False
    assert status["result_location"] is None and status["last_error_code"] is None
    for field in ("tiles_total", "samples_total", "result_sha256", "float_location",
                  "last_error", "created_at", "updated_at", "finished_at"):  # fmt: skip
        assert field in status


async def test_unknown_job_is_not_found(gateway: Gateway, client: TesseraClient) -> None:
    for call in (client.status, client.cancel, client.retry):
        with pytest.raises(ApiError) as err:
            await call(new_job_id())
        assert err.value.code == "not_found"


async def test_list_pages_newest_first_and_filters_by_state(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    ids = [await _submit(client, seed=i) for i in range(5)]
    first = await client.list(limit=2)
    assert [j["job_id"] for j in first["jobs"]] == ids[::-1][:2]
    second = await client.list(limit=2, cursor=first["next_cursor"])
    third = await client.list(limit=2, cursor=second["next_cursor"])
    assert [j["job_id"] for j in second["jobs"] + third["jobs"]] == ids[::-1][2:]
    assert third["next_cursor"] is None
    await client.cancel(ids[0])
    cancelled = await client.list(state="cancelled")
    assert [j["job_id"] for j in cancelled["jobs"]] == [ids[0]]
    assert cancelled["next_cursor"] is None


async def test_list_with_a_bad_state_is_invalid(gateway: Gateway, nc: NATS, names: Names) -> None:
    reply = await raw_request(nc, names, ApiVerb.LIST, b'{"state": "sleeping"}')
    assert reply["error"]["code"] == "invalid"


async def test_cancel_publishes_an_event_and_a_second_cancel_is_illegal(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id = await _submit(client)
    reply = await client.cancel(job_id)
    assert reply == {"job_id": job_id, "state": "cancelled", "cancel_requested": True}
    info = await runtime.js.stream_info(runtime.names.stream(STREAM_EVENTS))
    assert info.state.messages == 1
    raw = await runtime.js.get_msg(runtime.names.stream(STREAM_EVENTS), seq=1)
    assert raw.subject == runtime.names.event_subject(job_id, EventKind.JOB_CANCELLED)
    assert JobEvent.decode(raw.data or b"").kind is EventKind.JOB_CANCELLED
    with pytest.raises(ApiError) as err:
        await client.cancel(job_id)
    assert err.value.code == "illegal_state"


async def test_retry_of_a_failed_job_publishes_the_next_generation(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id = await _submit(client)
    with pytest.raises(ApiError) as err:
        await client.retry(job_id)  # queued, generation 0: nothing to retry
    assert err.value.code == "illegal_state"
    await runtime.db.transition_job(job_id, JobTrigger.TERMINAL_FAILURE, error_code="invalid")
    reply = await client.retry(job_id)
    assert reply["generation"] == 1 and reply["state"] == "queued"
    assert reply["replayed"] is False
    assert await jobs_messages(runtime) == 2
    raw = await runtime.js.get_msg(runtime.names.stream(STREAM_JOBS), seq=2)
    assert JobMessage.decode(raw.data or b"") == JobMessage(job_id, generation=1)
    again = await client.retry(job_id)  # its publish might have been lost: replay, absorbed
    assert again["replayed"] is True and again["generation"] == 1
    assert await jobs_messages(runtime) == 2


async def test_retry_of_a_completed_or_cancelled_job_is_illegal(
    gateway: Gateway, client: TesseraClient
) -> None:
    job_id = await _submit(client)
    await client.cancel(job_id)
    with pytest.raises(ApiError) as err:
        await client.retry(job_id)
    assert err.value.code == "illegal_state"


async def test_the_gateway_survives_a_handler_raising(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    async def broken(data: bytes, headers: object) -> StatusReply:
        raise RuntimeError("boom")

    subject = runtime.names.api_subject(ApiVerb.STATUS)
    healthy, gateway.routes[subject] = gateway.routes[subject], broken
    with pytest.raises(ApiError) as err:
        await client.status(new_job_id())
    assert err.value.code == "internal" and "boom" not in err.value.message
    gateway.routes[subject] = healthy
    job_id = await _submit(client)
    assert (await client.status(job_id))["job_id"] == job_id


async def test_run_serves_until_stopped(runtime: Runtime, client: TesseraClient) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(run(runtime, stop))

    async def answers() -> bool:
        try:
            await client.list(limit=1)
        except ApiError:
            return True
        except Exception:
            return False
        return True

    await eventually(answers, timeout=10, what="the gateway answers")
    stop.set()
    await asyncio.wait_for(task, 10)
