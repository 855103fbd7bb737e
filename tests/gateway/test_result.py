"""``tessera.api.result``: chunks over NATS (directory store), presigned URLs (S3), errors."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson
import pytest
from nats.aio.client import Client as NATS

from proto.api import SubmitRequest
from proto.names import ApiVerb, Names, new_job_id
from proto.replies import ApiError
from services.client.api import TesseraClient, fetch_url
from services.gateway.app import Gateway
from services.gateway.results import chunk_bytes
from shared.core.config import Settings
from shared.devstack.stack import S3_ACCESS_KEY, S3_BUCKET, S3_SECRET_KEY, SeaweedS3
from shared.objectstore import CorruptObject, sha256_hex
from shared.service.runtime import Runtime
from tests.gateway.conftest import body
from tests.gateway.results import completed_job

MiB = 1024 * 1024


async def test_an_image_larger_than_a_chunk_comes_in_chunks_that_fit_max_payload(
    gateway: Gateway, runtime: Runtime, client: TesseraClient, nc: NATS, names: Names
) -> None:
    png, floats = os.urandom(MiB + 12345), os.urandom(3000)
    job_id = await completed_job(runtime, client, png, floats)
    budget = min(512 * 1024, runtime.nc.max_payload // 2)
    assert gateway.results.chunk == chunk_bytes(budget) < len(png)
    offset, replies = 0, []
    while offset is not None:  # the raw protocol, as a non-Python client speaks it
        request = orjson.dumps({"job_id": job_id, "offset": offset})
        msg = await nc.request(names.api_subject(ApiVerb.RESULT), request, timeout=10)
        assert len(msg.data) <= budget, "each chunk reply stays inside the reply budget"
        reply = orjson.loads(msg.data)
        assert reply["ok"] is True and reply["url"] is None and reply["offset"] == offset
        replies.append(reply)
        offset = reply["next_offset"]
    assert len(replies) == -(-len(png) // gateway.results.chunk) >= 3
    data = b"".join(base64.b64decode(r["data_b64"]) for r in replies)
    assert data == png and {r["sha256"] for r in replies} == {sha256_hex(png)}
    assert {r["size"] for r in replies} == {len(png)}
    assert replies[0]["content_type"] == "image/png" and replies[0]["kind"] == "png"
    assert await client.download(job_id) == png
    assert await client.download(job_id, kind="float", chunk=1000) == floats


async def test_a_client_chosen_chunk_length(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    png = os.urandom(10_000)
    job_id = await completed_job(runtime, client, png, b"f")
    reply = await client.result(job_id, offset=9_000, length=4_000)
    assert (reply["offset"], reply["length"], reply["next_offset"]) == (9_000, 1_000, None)
    assert base64.b64decode(reply["data_b64"]) == png[9_000:]
    huge = await client.result(job_id, length=2**31 - 1)  # capped at the gateway's chunk
    assert huge["length"] == len(png) and huge["next_offset"] is None


async def test_bad_requests_get_structured_errors(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    with pytest.raises(ApiError) as err:
        await client.result(new_job_id())
    assert err.value.code == "not_found"
    queued = (await client.submit(SubmitRequest(**body(seed=9))))["job_id"]
    with pytest.raises(ApiError) as err:
        await client.result(queued)
    assert err.value.code == "illegal_state" and "queued" in err.value.message
    job_id = await completed_job(runtime, client, b"png", b"npy")
    for bad, code in (
        ({"offset": 4}, "invalid"),
        ({"length": 0}, "invalid"),
        ({"kind": "jpeg"}, "invalid"),
        ({"kind": 1}, "bad_request"),
        ({"inline": "yes"}, "bad_request"),
        ({"colour": "red"}, "bad_request"),
    ):
        with pytest.raises(ApiError) as err:
            await client.call(ApiVerb.RESULT, {"job_id": job_id, **bad})
        assert err.value.code == code, bad
    end = await client.result(job_id, offset=3)  # at the end: an empty last chunk
    assert (end["length"], end["data_b64"], end["next_offset"]) == (0, "", None)


async def test_a_corrupt_object_fails_the_download(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    job_id = await completed_job(runtime, client, b"the real image", b"f")
    status = await client.status(job_id)
    await runtime.store.put(status["result_location"], b"something else")
    with pytest.raises(CorruptObject):
        await client.download(job_id)


@pytest.fixture
async def s3_gateway(settings_env: dict[str, str], database_url: str, seaweed: SeaweedS3
) -> AsyncIterator[Gateway]:  # fmt: skip
    env = settings_env | {
        "TESSERA_OBJECT_STORE": f"s3://{S3_BUCKET}",
        "TESSERA_S3_ENDPOINT": seaweed.endpoint,
        "TESSERA_S3_ACCESS_KEY": S3_ACCESS_KEY,
        "TESSERA_S3_SECRET_KEY": S3_SECRET_KEY,
        "TESSERA_RESULT_URL_TTL": "120",
    }
    rt = await Runtime.open(Settings.from_env(env), "gateway")
    gw = Gateway(rt)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(5.0)
        await rt.close()


async def test_s3_gives_a_presigned_url_and_chunks_on_request(
    s3_gateway: Gateway, client: TesseraClient
) -> None:
    rt = s3_gateway.rt
    png, floats = os.urandom(700_000), os.urandom(50_000)
    job_id = await completed_job(rt, client, png, floats)
    before = datetime.now(UTC)
    reply = await client.result(job_id)
    after = datetime.now(UTC)
    expires = datetime.fromisoformat(reply["expires_at"])
    assert before + timedelta(seconds=120) <= expires <= after + timedelta(seconds=120)
    assert reply["url"].startswith(rt.settings.object_store.endpoint)
    assert reply["data_b64"] is None and reply["size"] == len(png)
    assert S3_SECRET_KEY not in reply["url"]
    fetched = await fetch_url(reply["url"], 10)  # plain HTTP from loopback, no credentials
    assert fetched == png and sha256_hex(fetched) == reply["sha256"]
    inline = await client.result(job_id, inline=True, length=100_000)
    assert inline["url"] is None and inline["next_offset"] == 100_000
    assert await client.download(job_id, kind="float") == floats
    assert await client.download(job_id, inline=True, chunk=200_000) == png


class _CountingGets:
    """The gateway's real store, counting whole-object reads."""

    def __init__(self, store: object) -> None:
        self.inner, self.gets = store, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def get(self, key: str, **kw: object) -> bytes:
        self.gets += 1
        data: bytes = await self.inner.get(key, **kw)  # type: ignore[attr-defined]
        return data


async def test_an_object_without_a_content_address_is_hashed_once_not_per_chunk(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    floats = os.urandom(5000)
    job_id = await completed_job(runtime, client, b"png", b"f")
    key = f"renders/{job_id}/by-hand.npy"  # no sha256 in the name: the gateway must hash it
    await runtime.store.put(key, floats)
    conn = await asyncpg.connect(runtime.settings.database_url)
    try:
        await conn.execute("UPDATE jobs SET float_location = $1 WHERE job_id = $2", key, job_id)
    finally:
        await conn.close()
    counting = _CountingGets(gateway.results.store)
    gateway.results.store = counting  # type: ignore[assignment]
    assert await client.download(job_id, kind="float", chunk=1000) == floats
    assert counting.gets == 1, "hashed once for its five chunks"
