"""submit: idempotency, conflicts, refusals that write nothing, replay of a lost publish."""

from __future__ import annotations

import asyncio

import msgpack
import orjson
import pytest
from nats.aio.client import Client as NATS

import kernel
from proto.api import SubmitRequest
from proto.messages import JobMessage
from proto.names import STREAM_JOBS, ApiVerb, Names, job_msg_id
from proto.replies import ApiError
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from services.gateway.handlers import new_job_for
from shared.service.runtime import Runtime
from tests.gateway.conftest import body, jobs_messages, raw_request


async def _only_jobs_message(rt: Runtime) -> tuple[JobMessage, dict[str, str]]:
    raw = await rt.js.get_msg(rt.names.stream(STREAM_JOBS), seq=1)
    assert raw.data is not None
    return JobMessage.decode(raw.data), raw.headers or {}


async def test_submit_creates_one_row_and_one_jobs_message(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    reply = await client.submit(SubmitRequest(**body()))
    assert reply["created"] is True and reply["duplicate"] is False
    assert reply["state"] == "queued"
    assert len(reply["idempotency_key"]) == 64 and reply["input_hash"]
    job = await runtime.db.get_job(reply["job_id"])
    assert job is not None and job.input_hash == reply["input_hash"]
    assert job.tile_size == 16 and job.request["spp"] == 4
    assert await jobs_messages(runtime) == 1
    message, headers = await _only_jobs_message(runtime)
    assert message == JobMessage(reply["job_id"], generation=0)
    assert headers["Nats-Msg-Id"] == job_msg_id(reply["job_id"], 0)


async def test_twenty_concurrent_identical_submits_make_one_job(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    request = SubmitRequest(**body())
    replies = await asyncio.gather(*(client.submit(request) for _ in range(20)))
    assert sum(r["created"] for r in replies) == 1
    assert sum(r["duplicate"] for r in replies) == 19
    assert len({r["job_id"] for r in replies}) == 1
    assert len(await runtime.db.list_jobs(limit=100)) == 1
    assert await jobs_messages(runtime) == 1
    assert gateway.handlers.duplicate_submits == 19


async def test_same_client_key_with_another_body_is_a_conflict(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    await client.submit(SubmitRequest(**body(idempotency_key="k1")))
    with pytest.raises(ApiError) as err:
        await client.submit(SubmitRequest(**body(idempotency_key="k1", spp=8)))
    assert err.value.code == "conflict"
    assert len(await runtime.db.list_jobs(limit=100)) == 1
    assert await jobs_messages(runtime) == 1


BAD_SCENE = {"camera": {"position": [0, 0, 0]}, "materials": {}}

BAD_REQUESTS = [
    ("malformed JSON", b'{"project": ', None, "bad_request"),
    ("msgpack garbage", b"\xc1\xc1\xc1", {"Content-Type": "application/msgpack"}, "bad_request"),
    ("not an object", b"[1, 2]", None, "bad_request"),
    ("wrong type", orjson.dumps(body(width="64")), None, "bad_request"),
    ("unknown field", orjson.dumps(body(colour="red")), None, "bad_request"),
    ("missing field", orjson.dumps({"project": "gw", "scene": "cornell"}), None, "bad_request"),
    ("width too large", orjson.dumps(body(width=100_000)), None, "invalid"),
    ("spp zero", orjson.dumps(body(spp=0)), None, "invalid"),
    ("fractional seed", orjson.dumps(body(seed=1.5)), None, "invalid"),
    ("unknown builtin", orjson.dumps(body(scene="teapot")), None, "invalid"),
    ("invalid inline scene", orjson.dumps(body(scene=BAD_SCENE)), None, "invalid"),
    ("bad content type", b"{}", {"Content-Type": "text/plain"}, "bad_request"),
]


@pytest.mark.parametrize(("data", "headers", "code"), [c[1:] for c in BAD_REQUESTS],
                         ids=[c[0] for c in BAD_REQUESTS])  # fmt: skip
async def test_bad_requests_get_structured_errors_and_write_nothing(
    gateway: Gateway, runtime: Runtime, nc: NATS, names: Names, data, headers, code
) -> None:
    reply = await raw_request(nc, names, ApiVerb.SUBMIT, data, headers)
    assert reply["ok"] is False
    assert reply["error"]["code"] == code, reply
    assert reply["error"]["message"]
    assert await runtime.db.list_jobs(limit=10) == []
    assert await jobs_messages(runtime) == 0


async def test_error_messages_name_the_field(gateway: Gateway, nc: NATS, names: Names) -> None:
    unknown = await raw_request(nc, names, ApiVerb.SUBMIT, orjson.dumps(body(scene="teapot")))
    assert "cornell" in unknown["error"]["message"]  # the known builtins are listed
    bad = await raw_request(nc, names, ApiVerb.SUBMIT, orjson.dumps(body(scene=BAD_SCENE)))
    assert "camera" in bad["error"]["message"] or "materials" in bad["error"]["message"]


async def test_msgpack_and_inline_scenes_are_accepted(
    gateway: Gateway, runtime: Runtime, nc: NATS, names: Names
) -> None:
    inline = kernel.builtin_scene("spheres")
    data = msgpack.packb(body(scene=inline))
    reply = await raw_request(
        nc, names, ApiVerb.SUBMIT, data, {"Content-Type": "application/msgpack"}
    )
    assert reply["ok"] is True and reply["created"] is True
    job = await runtime.db.get_job(reply["job_id"])
    assert job is not None and job.scene == inline


async def test_duplicate_of_a_job_whose_publish_was_lost_publishes_it(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    """A gateway that crashed between the insert and the publish: the client's retry heals it."""
    request = SubmitRequest(**body())
    doc = kernel.builtin_scene("cornell")
    settings = kernel.RenderSettings(width=64, height=48, spp=4, max_depth=8, seed=0)
    inserted = await runtime.db.submit_job(
        new_job_for(request, doc, kernel.input_hash(doc, 0, settings))
    )
    assert await jobs_messages(runtime) == 0
    reply = await client.submit(request)
    assert reply["duplicate"] is True and reply["job_id"] == inserted.job.job_id
    assert reply["input_hash"] == inserted.job.input_hash
    assert await jobs_messages(runtime) == 1
    await client.submit(request)  # the msg id absorbs a further copy
    assert await jobs_messages(runtime) == 1
