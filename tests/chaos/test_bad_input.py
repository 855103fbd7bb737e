"""Hypothesis against a gateway process: garbage in, structured errors out, nothing written.

Every API subject gets malformed JSON and msgpack, wrong types, huge, negative and NaN numbers,
deep nesting, oversize bodies, unknown scenes and path-like strings, alone and spliced into an
otherwise valid request. Every reply must be ``{"ok": false, "error": {"code": <ErrorCode>,
"message": str}}`` (never ``internal``: that is a bug) or a legitimate ok; the gateway must stay
up; and a rejected request must leave no job row, no JOBS/TILES message and no object.

Hypothesis runs in a thread (its examples are synchronous); each example's request runs on the
test's event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto import names as n
from proto.names import ApiVerb
from proto.replies import ErrorCode
from tests.chaos.rig import Rig, open_rig
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

CODES = {c.value for c in ErrorCode} - {ErrorCode.INTERNAL.value}
_DIGEST = "ab" * 32
VALID: dict[ApiVerb, dict[str, Any]] = {
    ApiVerb.SUBMIT: {
        "project": "fuzz",
        "scene": "cornell",
        "width": 16,
        "height": 16,
        "spp": 1,
        "tile_size": 16,
    },
    ApiVerb.STATUS: {"job_id": "01a2b3c4-0000-7000-8000-000000000000"},
    ApiVerb.CANCEL: {"job_id": "01a2b3c4-0000-7000-8000-000000000000"},
    ApiVerb.RETRY: {"job_id": "01a2b3c4-0000-7000-8000-000000000000"},
    ApiVerb.LIST: {"state": "queued", "limit": 5},
    ApiVerb.DLQ_LIST: {"limit": 5},
    ApiVerb.DLQ_SHOW: {"seq": 1},
    ApiVerb.DLQ_PURGE: {"job_id": "01a2b3c4-0000-7000-8000-000000000000", "dry_run": True},
    ApiVerb.DLQ_REQUEUE: {"job_id": "01a2b3c4-0000-7000-8000-000000000000", "dry_run": True},
    ApiVerb.RESULT: {"job_id": "01a2b3c4-0000-7000-8000-000000000000", "kind": "png"},
    ApiVerb.PRIORITY: {"job_id": "01a2b3c4-0000-7000-8000-000000000000", "priority": 60},
    ApiVerb.PAUSE: {"job_id": "01a2b3c4-0000-7000-8000-000000000000"},
    ApiVerb.RESUME: {"job_id": "01a2b3c4-0000-7000-8000-000000000000"},
    ApiVerb.PROJECT_SET: {"name": "fuzz", "weight": 2, "max_in_flight": 3, "actor": "fuzz"},
    ApiVerb.PROJECT_LIST: {"limit": 5},
    ApiVerb.PROJECT_SHOW: {"name": "fuzz"},
    ApiVerb.ASSET_MISSING: {"chunks": [_DIGEST]},
    # JSON cannot carry a chunk's bytes (msgpack only): every body of it is refused, as it
    # must be, and nothing is stored (checked below)
    ApiVerb.ASSET_CHUNK: {"sha256": _DIGEST, "data": "AAAA"},
    ApiVerb.ASSET_MANIFEST: {
        "manifest": {
            "main": "a.pov",
            "files": [{"path": "a.pov", "size": 3, "sha256": _DIGEST, "chunks": [_DIGEST]}],
        },
        "renderer": "povray",
    },
    ApiVerb.JOB_TILES: {"job_id": "01a2b3c4-0000-7000-8000-000000000000", "offset": 0},
    ApiVerb.JOB_TIMELINE: {"job_id": "01a2b3c4-0000-7000-8000-000000000000", "limit": 5},
    ApiVerb.JOB_PREVIEW: {"job_id": "01a2b3c4-0000-7000-8000-000000000000", "max_edge": 64},
    ApiVerb.WORKERS: {"renderer": "tessera"},
    ApiVerb.FARM: {"window": 60},
}

nasty_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=80),
    st.sampled_from(
        [
            "../../etc/passwd",
            "/etc/shadow",
            "C:\\Windows",
            "..",
            "a/../../b",
            "tiles/../renders/x.png",
            "file:///etc",
            "s3://other/key",
            "\x00",
            "nope",
            "cornell\n",
            "CORNELL",
            "*",
            ">",
            "job.*",
        ]
    ),
)
json_values = st.recursive(
    nasty_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)


def _dumps(value: Any) -> bytes:
    """JSON with NaN/Infinity literals and integers of any size (what a sloppy client sends)."""
    return json.dumps(value, allow_nan=True).encode()


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@st.composite
def bodies(draw: st.DrawFn, verb: ApiVerb) -> tuple[bytes, dict[str, str] | None]:
    """One request body (and headers) for ``verb``."""
    valid = VALID[verb]
    kind = draw(st.sampled_from(["splice", "splice", "splice", "json", "raw", "msgpack",
                                 "msgpack_garbage", "deep", "oversize", "extra"]))  # fmt: skip
    if kind == "splice":  # a valid request with one field replaced (or dropped)
        body = dict(valid)
        field = draw(st.sampled_from(sorted(body)))
        if draw(st.booleans()):
            body[field] = draw(json_values)
        else:
            del body[field]
        return _dumps(body), None
    if kind == "extra":
        return _dumps(valid | {draw(st.text(min_size=1, max_size=12)): draw(json_values)}), None
    if kind == "json":
        return _dumps(draw(json_values)), None
    if kind == "raw":
        return draw(st.binary(max_size=300)), None
    if kind == "msgpack":
        value = draw(st.one_of(json_values, st.just(valid)))
        try:
            packed = msgpack.packb(value, use_bin_type=draw(st.booleans()))
        except OverflowError:  # msgpack has no integers beyond 64 bits
            packed = msgpack.packb(valid | {"limit": 2**64 - 1, "seed": -(2**63)})
        return packed, {"Content-Type": "application/msgpack"}
    if kind == "msgpack_garbage":
        return draw(st.binary(max_size=300)), {"Content-Type": "application/msgpack"}
    if kind == "deep":
        return _deep(draw(st.integers(min_value=30, max_value=50_000))), None
    # just under NATS's 1 MiB max_payload: the largest body a client can send at all
    filler = "x" * draw(st.integers(min_value=100_000, max_value=1_000_000))
    return _dumps(valid | {"project": filler}), None


async def _request(rig: Rig, verb: ApiVerb, data: bytes, headers: dict[str, str] | None) -> Any:
    msg = await rig.nc.request(rig.names.api_subject(verb), data, timeout=15, headers=headers)
    return orjson.loads(msg.data)


async def test_garbage_gets_structured_errors_and_writes_nothing(
    chaos_env: dict[str, str], tmp_path: Path
) -> None:
    loop = asyncio.get_running_loop()
    accepted: set[str] = set()
    seen: Counter[ApiVerb] = Counter()
    async with open_rig(chaos_env, tmp_path / "logs", start=False) as rig:
        gateway = rig.procs.start("gateway")
        await eventually(
            lambda: _answers(rig), timeout=60, what="the gateway answers", detail=rig.procs.logs
        )

        def fuzz(verb: ApiVerb) -> None:
            @settings(max_examples=150, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
            @given(bodies(verb))
            def one(case: tuple[bytes, dict[str, str] | None]) -> None:
                data, headers = case
                call = _request(rig, verb, data, headers)
                reply = asyncio.run_coroutine_threadsafe(call, loop).result(timeout=30)
                _check_reply(verb, reply, data, accepted)
                seen[verb] += 1

            one()

        for verb in VALID:
            await asyncio.to_thread(fuzz, verb)
        counts = ", ".join(f"{v.value} {c}" for v, c in seen.items())
        print(f"\nbad input: requests {counts}; {len(accepted)} accepted submits")
        assert min(seen.values()) >= 100, seen
        assert gateway.alive(), rig.procs.logs()
        assert await _answers(rig), "the gateway still answers a status"
        jobs = await rig.db.list_jobs(limit=1000)
        assert {j.job_id for j in jobs} == accepted, "only accepted submits made job rows"
        js = rig.nc.jetstream()
        messages = {
            s: (await js.stream_info(rig.names.stream(s))).state.messages
            for s in (n.STREAM_JOBS, n.STREAM_TILES)
        }
        assert messages == {n.STREAM_JOBS: len(accepted), n.STREAM_TILES: 0}
        assert await rig.objects.list("") == []


def test_every_api_verb_is_fuzzed() -> None:
    assert set(VALID) == set(ApiVerb)


async def _answers(rig: Rig) -> bool:
    try:
        reply = await _request(rig, ApiVerb.STATUS, _dumps(VALID[ApiVerb.STATUS]), None)
    except Exception:
        return False
    return reply.get("error", {}).get("code") == "not_found"


def _check_reply(verb: ApiVerb, reply: Any, data: bytes, accepted: set[str]) -> None:
    assert isinstance(reply, dict) and isinstance(reply.get("ok"), bool), reply
    if reply["ok"]:
        if verb is ApiVerb.SUBMIT:
            accepted.add(reply["job_id"])
        return
    error = reply.get("error")
    assert isinstance(error, dict) and set(error) == {"code", "message"}, reply
    assert error["code"] in CODES, f"{verb}: {error} for {data[:200]!r}"
    assert isinstance(error["message"], str)
