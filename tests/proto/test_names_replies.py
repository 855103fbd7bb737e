"""Names are tokens and prefixes isolate; replies have the documented shape."""

from __future__ import annotations

import time
import uuid

import orjson
import pytest

from proto import names as n
from proto.replies import (
    ApiError,
    ErrorCode,
    decode_reply,
    error_code_for,
    error_reply,
    ok_reply,
    reply_for_exception,
)
from proto.topology import Topology
from shared.core import errors
from shared.core.lifecycle import IllegalTransition


def test_job_ids_are_time_ordered_uuid7_tokens() -> None:
    ids = []
    for _ in range(3):
        ids.append(n.new_job_id())
        time.sleep(0.002)
    assert ids == sorted(ids)
    for job_id in ids:
        assert uuid.UUID(job_id).version == 7 and n.TOKEN_RE.fullmatch(job_id)


def test_attempt_ids_are_time_ordered_32_hex_digit_tokens() -> None:
    # the shape of uuid4().hex, which attempt ids had; ordered so the attempts table's primary
    # key grows at its end
    ids = [n.new_attempt_id() for _ in range(50)]
    assert all(len(i) == 32 and int(i, 16) >= 0 and n.check_token(i, "attempt") for i in ids)
    assert len(set(ids)) == 50
    assert [i[:12] for i in ids] == sorted(i[:12] for i in ids), "millisecond prefix ordered"
    assert uuid.UUID(ids[0]).version == 7


def test_subjects_keys_and_ids() -> None:
    nm, job = n.Names(), "0190abcd-0000-7000-8000-000000000001"
    assert nm.tile_subject(job, 7) == f"tessera.tiles.tessera.{job}.7"
    assert nm.tile_subject(job, 7, "povray") == f"tessera.tiles.povray.{job}.7"
    assert nm.tile_subjects_of(job) == f"tessera.tiles.*.{job}.*"
    assert nm.renderer_tiles("blender") == "tessera.tiles.blender.>"
    assert n.workers_consumer("tessera") == "workers"  # the name before renderers: kept
    assert n.workers_consumer("povray") == "workers-povray"
    assert n.tile_of_subject(nm.tile_subject(job, 7, "blender")) == (job, 7)
    # a message carrying a run of tiles names them all in its subject
    assert nm.tile_subject(job, 16, run=16) == f"tessera.tiles.tessera.{job}.16-31"
    assert n.tiles_of_subject(nm.tile_subject(job, 16, run=16)) == (job, range(16, 32))
    assert n.tiles_of_subject(nm.tile_subject(job, 7, "povray")) == (job, range(7, 8))
    assert n.tile_of_subject(nm.tile_subject(job, 16, run=16)) is None
    assert n.job_of_tile_subject(nm.tile_subject(job, 16, run=16)) == job
    assert n.tile_msg_id(job, 16, 1, 16) == f"tile:{job}:16:1:16"
    assert nm.event_subject(job, n.EventKind.TILE_DONE) == f"tessera.events.{job}.tile-done"
    assert nm.dlq_subject(job, n.dlq_unit_tile(7)) == f"tessera.dlq.{job}.tile-7"
    assert nm.api_subject(n.ApiVerb.DLQ_REQUEUE) == "tessera.api.dlq.requeue"
    assert n.lease_key_tile(job, 7) == n.progress_key(job, 7) == f"tile.{job}.7"
    assert n.lease_key_final(job) == f"final.{job}"
    assert n.job_msg_id(job, 2) == f"job:{job}:2"
    assert n.tile_msg_id(job, 7, 1) == f"tile:{job}:7:1"
    assert n.done_msg_id(job, 7, 42) == f"done:{job}:7:42"
    assert n.event_msg_id(job, n.EventKind.JOB_COMPLETED, 0) == f"event:{job}:job-completed:0"
    assert n.dlq_msg_id("TILES", 42) == "dlq:TILES:42"


@pytest.mark.parametrize("bad", ["a.b", "a*", "a>", "", "a b", "x" * 65, "$x"])
def test_non_token_ids_are_refused(bad: str) -> None:
    with pytest.raises(errors.ValidationError, match="job_id"):
        n.Names().job_subject(bad)
    with pytest.raises(errors.ValidationError):
        n.lease_key_final(bad)


@pytest.mark.parametrize("bad", [-1, True, 1.0])
def test_bad_indices_are_refused(bad: object) -> None:
    with pytest.raises(errors.ValidationError, match="tile_index"):
        n.tile_msg_id("j", bad, 0)  # type: ignore[arg-type]


def overlap(a: str, b: str) -> bool:
    """Whether two subject patterns can match a common subject (``*`` and ``>`` wildcards)."""
    ta, tb = a.split("."), b.split(".")
    for x, y in zip(ta, tb, strict=False):
        if ">" in (x, y):
            return True
        if x != y and "*" not in (x, y):
            return False
    return len(ta) == len(tb)


def subjects(t: Topology) -> list[str]:
    return [s for cfg in t.streams() for s in cfg.subjects or []]


@pytest.mark.parametrize("prefix", ["ta", "tessera", "JOBS", "tessera_x"])
def test_prefix_makes_every_name_disjoint(prefix: str) -> None:
    assert overlap("a.*.c", "a.b.>") and not overlap("a.b", "a.b.c") and overlap("x.>", "x.y")
    mine, default = Topology(prefix=prefix), Topology()
    assert all(s.name and s.name.startswith((f"{prefix}_", "KV_")) for s in mine.streams())
    assert not {s.name for s in mine.streams()} & {s.name for s in default.streams()}
    for x in subjects(mine):
        assert not any(overlap(x, y) for y in subjects(default)), x
        assert sum(overlap(x, y) for y in subjects(mine)) == 1, x  # only itself
    a = Topology(prefix="ta")
    assert a.names.tile_subject("j", 1) == "ta.tessera.tiles.tessera.j.1"
    assert a.names.queue_group == "ta_tessera-gateway"
    with pytest.raises(errors.ValidationError):
        Topology(prefix="a.b")


@pytest.mark.parametrize(
    "params",
    [{"replicas": 2}, {"ack_wait": 0.5}, {"max_deliver": 0}, {"duplicate_window": 10**9}],
)
def test_bad_topology_parameters(params: dict[str, float]) -> None:
    with pytest.raises(errors.ConfigError):
        Topology(**params)  # type: ignore[arg-type]


def test_reply_shapes() -> None:
    assert orjson.loads(ok_reply(job_id="j", state="queued")) == {
        "ok": True,
        "job_id": "j",
        "state": "queued",
    }
    assert orjson.loads(error_reply(ErrorCode.CONFLICT, "key reused")) == {
        "ok": False,
        "error": {"code": "conflict", "message": "key reused"},
    }
    with pytest.raises(ValueError):
        ok_reply(ok=False)
    assert decode_reply(ok_reply(n=1)) == {"n": 1}
    with pytest.raises(ApiError) as info:
        decode_reply(error_reply(ErrorCode.NOT_FOUND, "no job j"))
    assert info.value.error_code is ErrorCode.NOT_FOUND
    with pytest.raises(errors.DecodeError):
        decode_reply(b"[]")


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.DecodeError("x"), ErrorCode.BAD_REQUEST),
        (errors.ValidationError("x"), ErrorCode.INVALID),
        (errors.ConflictError("x"), ErrorCode.CONFLICT),
        (errors.NotFoundError("x"), ErrorCode.NOT_FOUND),
        (IllegalTransition("x"), ErrorCode.ILLEGAL_STATE),
        (errors.StoreUnavailable("x"), ErrorCode.UNAVAILABLE),
        (errors.FencedError("x"), ErrorCode.INTERNAL),
        (KeyError("secret"), ErrorCode.INTERNAL),
    ],
)
def test_exceptions_map_to_codes(exc: BaseException, code: ErrorCode) -> None:
    assert error_code_for(exc) is code
    body = orjson.loads(reply_for_exception(exc))
    assert body["error"]["code"] == code.value
    assert ("secret" in body["error"]["message"]) is False


@pytest.mark.parametrize(
    ("subject", "job"),
    [
        ("tessera.tiles.j1.0", "j1"),  # the form before renderers
        ("t9.tessera.tiles.job-7.12", "job-7"),
        ("tessera.tiles.tessera.j1.0", "j1"),
        ("t9.tessera.tiles.povray.job-7.12", "job-7"),
        ("tessera.tiles.blender.j1.x", None),
        ("tessera.tiles.j1.x", None),
        ("tessera.tiles.tessera.j1.3-5", "j1"),  # a run of tiles 3, 4 and 5
        ("tessera.tiles.tessera.j1.5-3", None),
        ("tessera.tiles.tessera.j1.3-", None),
        ("tessera.tiles.tessera.j1.-3", None),
        ("tessera.jobs.j1", None),
        ("garbage", None),
        ("tessera.tiles.bad$job.1", None),
    ],
)
def test_the_job_of_a_tile_subject(subject: str, job: str | None) -> None:
    assert n.job_of_tile_subject(subject) == job


@pytest.mark.parametrize("run", [0, -1, True, 1.5])
def test_bad_runs_are_refused(run: object) -> None:
    with pytest.raises(errors.ValidationError, match="run"):
        n.Names().tile_subject("j", 0, run=run)  # type: ignore[arg-type]
    with pytest.raises(errors.ValidationError, match="run"):
        n.tile_msg_id("j", 0, 0, run)  # type: ignore[arg-type]
