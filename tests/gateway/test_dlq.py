"""dlq.list, dlq.show and dlq.purge against a real DLQ stream."""

from __future__ import annotations

import pytest

from proto.messages import DeadLetter, TileMessage
from proto.names import STREAM_TILES, dlq_msg_id, dlq_unit_tile, new_job_id
from proto.replies import ApiError
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from shared.jetstream import publish
from shared.runtime import Runtime


async def _dead_letter(rt: Runtime, job_id: str, tile: int, source_seq: int) -> None:
    unit = dlq_unit_tile(tile)
    letter = DeadLetter(
        job_id=job_id,
        unit=unit,
        reason="max_deliveries",
        error="worker crashed",
        source_stream=rt.names.stream(STREAM_TILES),
        source_seq=source_seq,
        deliveries=5,
        subject=rt.names.tile_subject(job_id, tile),
        payload=TileMessage(job_id, tile).encode(),
    )
    msg_id = dlq_msg_id(rt.names.stream(STREAM_TILES), source_seq)
    await publish(rt.js, rt.names.dlq_subject(job_id, unit), letter.encode(), msg_id=msg_id)


async def test_list_show_and_purge(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    a, b = new_job_id(), new_job_id()
    for i, (job, tile) in enumerate([(a, 0), (b, 0), (a, 3)], start=1):
        await _dead_letter(runtime, job, tile, source_seq=i)
    everything = await client.dlq_list()
    assert [d["seq"] for d in everything["dead_letters"]] == [1, 2, 3]
    assert everything["next_cursor"] is None
    page = await client.dlq_list(job_id=a, limit=1)
    assert [d["unit"] for d in page["dead_letters"]] == ["tile-0"]
    rest = await client.dlq_list(job_id=a, cursor=page["next_cursor"])
    assert [d["unit"] for d in rest["dead_letters"]] == ["tile-3"]
    shown = (await client.dlq_show(2))["dead_letter"]
    assert shown["job_id"] == b and shown["reason"] == "max_deliveries"
    assert shown["payload_b64"]
    with pytest.raises(ApiError) as err:
        await client.dlq_show(99)
    assert err.value.code == "not_found"
    dry = await client.dlq_purge(job_id=a, dry_run=True)
    assert dry == {"purged": 0, "matched": 2, "dry_run": True}
    assert (await client.dlq_purge(job_id=a))["purged"] == 2
    left = await client.dlq_list()
    assert [d["job_id"] for d in left["dead_letters"]] == [b]
    assert (await client.dlq_purge(everything=True))["purged"] == 1
    assert (await client.dlq_list())["dead_letters"] == []


async def test_purge_needs_a_job_or_all(gateway: Gateway, client: TesseraClient) -> None:
    with pytest.raises(ApiError) as err:
        await client.dlq_purge()
    assert err.value.code == "invalid"
