"""dlq.list, dlq.show and dlq.purge against a real DLQ stream."""

from __future__ import annotations

import orjson
import pytest

from proto.api_replies import DlqListReply
from proto.limits import MAX_REPLY_BYTES, MAX_VIEW_ERROR
from proto.messages import DeadLetter, TileMessage
from proto.names import STREAM_TILES, ApiVerb, dlq_msg_id, dlq_unit_tile, new_job_id
from proto.replies import ApiError
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from services.gateway.views import within_budget
from shared.nats.jetstream import publish
from shared.service.runtime import Runtime


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


async def test_requeue_of_the_letters_named_by_sequence(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    a, b = new_job_id(), new_job_id()
    for i, (job, tile) in enumerate([(a, 0), (b, 0), (a, 3)], start=1):
        await _dead_letter(runtime, job, tile, source_seq=i)
    named = await client.dlq_requeue(dry_run=True, seqs=[3, 2, 99, 3])
    assert [d["seq"] for d in named["dead_letters"]] == [3, 2], "as named, each once"
    assert named["examined"] == 2 and named["missing"] == [99]
    of_a = await client.dlq_requeue(dry_run=True, job_id=a, seqs=[1, 2])
    assert [d["seq"] for d in of_a["dead_letters"]] == [1] and of_a["missing"] == [2]
    everything = await client.dlq_requeue(dry_run=True)
    assert everything["examined"] == 3 and everything["missing"] == []
    for bad, code in (([], "invalid"), ([0], "invalid"), ("1", "bad_request")):
        with pytest.raises(ApiError) as err:
            await client.call(ApiVerb.DLQ_REQUEUE, {"seqs": bad, "dry_run": True})
        assert err.value.code == code, bad


async def test_purge_needs_a_job_or_all(gateway: Gateway, client: TesseraClient) -> None:
    with pytest.raises(ApiError) as err:
        await client.dlq_purge()
    assert err.value.code == "invalid"


async def _long_letters(rt: Runtime, count: int) -> list[str]:
    """``count`` dead letters of unknown jobs, each with an 8000-character error."""
    errors = []
    for i in range(count):
        error = f"{i:05d}:" + "x" * 7994
        letter = DeadLetter(
            job_id=new_job_id(), unit=dlq_unit_tile(0), reason="terminal", error=error,
            source_stream=rt.names.stream(STREAM_TILES), source_seq=i + 1, deliveries=1,
            subject=rt.names.tile_subject("j", 0), payload=b"",
        )  # fmt: skip
        await publish(rt.js, rt.names.dlq_subject(letter.job_id, letter.unit), letter.encode(),
                      msg_id=dlq_msg_id(rt.names.stream(STREAM_TILES), i + 1))  # fmt: skip
        errors.append(error)
    return errors


async def test_pages_and_requeue_reports_stay_below_max_payload(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    """1,200 letters of 8 KB errors are 10 MB: pages end early, every letter is reached once."""
    errors = await _long_letters(runtime, 1200)
    seen: list[int] = []
    cursor, pages = None, 0
    while True:
        page = await client.dlq_list(limit=1000, cursor=cursor)
        pages += 1
        for d in page["dead_letters"]:
            assert d["error"] == errors[d["seq"] - 1][: MAX_VIEW_ERROR - 1] + "\u2026"
        if pages == 1:
            assert len(page["dead_letters"]) < 1000, "the first page is cut by size"
        seen += [d["seq"] for d in page["dead_letters"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(range(1, 1201)), "nothing lost or repeated across the pages"
    assert (await client.dlq_show(7))["dead_letter"]["error"] == errors[6], "show has it whole"

    report = await client.dlq_requeue(dry_run=True, limit=10_000)
    assert report["examined"] == 1200 and report["skipped"] == 1200  # no such jobs
    assert 0 < len(report["dead_letters"]) < 1200
    assert report["omitted"] == 1200 - len(report["dead_letters"])
    assert [d["seq"] for d in report["dead_letters"]] == list(
        range(1, len(report["dead_letters"]) + 1)
    )


async def test_the_budget_follows_a_smaller_max_payload(
    gateway: Gateway, runtime: Runtime, client: TesseraClient
) -> None:
    """On a server with a small max_payload, pages shrink to half of it."""
    assert gateway.dlq.reply_budget == min(MAX_REPLY_BYTES, runtime.nc.max_payload // 2)
    await _long_letters(runtime, 40)
    gateway.dlq.reply_budget = 8_000  # what a 16 KB max_payload would give
    page = await client.dlq_list(limit=1000)
    views = page["dead_letters"]
    assert 0 < len(views) < 40 and page["next_cursor"] == str(views[-1]["seq"])
    assert sum(len(orjson.dumps(v)) + 1 for v in views) <= 8_000
    report = await client.dlq_requeue(dry_run=True)
    assert report["examined"] == 40 and report["omitted"] == 40 - len(report["dead_letters"]) > 0


async def test_a_reply_over_max_payload_becomes_a_clear_error(
    gateway: Gateway, runtime: Runtime
) -> None:
    """The net under every handler: an oversized reply is answered, never dropped."""
    subject = runtime.names.api_subject(ApiVerb.STATUS)

    async def huge(data: bytes, headers: object) -> DlqListReply:
        return DlqListReply(dead_letters=[], next_cursor="x" * (runtime.nc.max_payload + 1))

    gateway.routes[subject] = huge
    reply = orjson.loads(await gateway.dispatch(subject, b"{}", None))
    assert reply["ok"] is False and reply["error"]["code"] == "internal"
    assert "max_payload" in reply["error"]["message"]


def test_within_budget_keeps_a_prefix_and_at_least_one() -> None:
    views = [{"n": i, "text": "y" * 100} for i in range(50)]
    kept = within_budget(views, budget=1000)
    assert kept == views[: len(kept)] and 0 < len(kept) < 50
    assert sum(len(orjson.dumps(v)) + 1 for v in kept) <= 1000
    assert within_budget([{"text": "z" * 5000}], budget=10) == [{"text": "z" * 5000}]
    assert within_budget([], budget=10) == []
