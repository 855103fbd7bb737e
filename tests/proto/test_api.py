"""API request decoding and validation: limits named, garbage never escapes as anything else."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto import api, limits
from proto.api import (
    REQUEST_SCHEMAS,
    DlqPurgeRequest,
    DlqRequeueRequest,
    JobRequest,
    ListRequest,
    SubmitRequest,
    decode_request,
    encode_request,
)
from shared.core.errors import DecodeError, TerminalError, ValidationError
from shared.core.lifecycle import JobState

from .strategies import dumped, json_values, msgpack_values, mutated_maps, packed

MSGPACK = {"Content-Type": "application/msgpack"}
BASE: dict[str, Any] = {"project": "demo", "scene": "cornell", "width": 64, "height": 48, "spp": 4}


def submit(**changes: Any) -> SubmitRequest:
    return decode_request(dumped({**BASE, **changes}), None, SubmitRequest)


def only_terminal_api_errors(data: bytes, headers: dict[str, str] | None, schema: Any) -> None:
    with contextlib.suppress(DecodeError, ValidationError):
        decode_request(data, headers, schema)


@pytest.mark.parametrize("schema", REQUEST_SCHEMAS)
@pytest.mark.parametrize("headers", [None, MSGPACK])
@given(raw=st.binary(max_size=300))
def test_random_bytes_raise_only_decode_error(schema: Any, headers: Any, raw: bytes) -> None:
    try:
        decode_request(raw, headers, schema)
    except DecodeError:
        pass
    except ValidationError:  # random bytes that happen to be a valid body, e.g. b"{}" for list
        assert raw.strip().startswith(b"{") or headers


@pytest.mark.parametrize("schema", REQUEST_SCHEMAS)
@given(value=json_values)
def test_random_json_structures(schema: Any, value: Any) -> None:
    only_terminal_api_errors(dumped(value), None, schema)


@pytest.mark.parametrize("schema", REQUEST_SCHEMAS)
@given(value=msgpack_values)
def test_random_msgpack_structures(schema: Any, value: Any) -> None:
    only_terminal_api_errors(packed(value), MSGPACK, schema)


@given(body=mutated_maps({**BASE, "frame": 1, "seed": 7, "idempotency_key": "k-1"}))
def test_near_miss_submit_bodies(body: dict[str, Any]) -> None:
    only_terminal_api_errors(packed(body), MSGPACK, SubmitRequest)
    only_terminal_api_errors(dumped(body), None, SubmitRequest)


def test_valid_submit_applies_defaults_and_round_trips() -> None:
    request = submit(height=48.0)
    assert (request.frame, request.tile_size, request.max_depth, request.seed) == (0, 64, 64, 0)
    assert request.height == 48 and isinstance(request.height, int)
    assert decode_request(encode_request(request), None, SubmitRequest) == request
    assert decode_request(packed(request.to_body()), MSGPACK, SubmitRequest) == request


def test_inline_scene_and_msgpack_content_type_parameters() -> None:
    scene = {"objects": [{"sphere": {"r": 1.5}}], "camera": {"fov": 40}}
    body = packed({**BASE, "scene": scene})
    headers = {"content-type": "application/msgpack; charset=binary"}
    assert decode_request(body, headers, SubmitRequest).scene == scene


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("width", 0, "1..8192"),
        ("width", 8193, "1..8192"),
        ("height", 10**40, "1..8192"),
        ("spp", 65537, "1..65536"),
        ("spp", -1, "1..65536"),
        ("tile_size", 7, "8..1024"),
        ("tile_size", 1025, "8..1024"),
        ("frame", 1_000_001, "0..1000000"),
        ("max_depth", 65, "1..64"),
        ("seed", 2**32, "0..4294967295"),
        ("project", "x" * 65, "limit 64"),
        ("project", "a b", "does not match"),
        ("scene", "Not A Name", "does not match"),
        ("idempotency_key", "k" * 129, "limit 128"),
    ],
)
def test_limits_are_named(field: str, value: Any, limit: str) -> None:
    with pytest.raises(ValidationError) as info:
        submit(**{field: value})
    assert str(info.value).startswith(f"{field}: ")
    assert limit in str(info.value)


def test_tile_count_limit() -> None:
    with pytest.raises(ValidationError, match=r"tiles: 1048576 is outside the limit 1\.\.16384"):
        submit(width=8192, height=8192, tile_size=8)
    assert submit(width=8192, height=8192, tile_size=64).tile_size == 64


@pytest.mark.parametrize(
    ("field", "value", "error", "text"),
    [
        ("width", True, DecodeError, "width: expected an integer, got bool"),
        ("width", "64", DecodeError, "width: expected an integer, got str"),
        ("width", [64], DecodeError, "width: expected an integer, got list"),
        ("width", 64.5, ValidationError, "width: 64.5 is not a finite integer"),
        ("width", float("nan"), ValidationError, "width: nan is not a finite integer"),
        ("width", float("inf"), ValidationError, "width: inf is not a finite integer"),
        ("project", 7, DecodeError, "project: expected a string"),
        ("scene", 7, DecodeError, "scene: expected a name or an object"),
        ("scene", {"x": float("nan")}, ValidationError, "scene: $.x: nan is not a finite"),
        ("scene", {"x": b"raw"}, ValidationError, "scene: $.x: bytes is not a JSON value"),
        ("bogus", 1, DecodeError, "unknown field(s) 'bogus'"),
    ],
)
def test_types_and_non_finite_numbers(field: str, value: Any, error: type, text: str) -> None:
    with pytest.raises(error) as info:  # msgpack so NaN/inf/bytes can be sent at all
        decode_request(packed({**BASE, field: value}), MSGPACK, SubmitRequest)
    assert text in str(info.value)


def test_scene_size_and_depth_limits() -> None:
    deep: Any = "leaf"
    for _ in range(limits.MAX_SCENE_DEPTH):
        deep = {"d": deep}
    assert submit(scene=deep).scene == deep
    with pytest.raises(ValidationError, match="scene: nesting depth 33 exceeds the limit 32"):
        submit(scene={"d": deep})
    big = {"blob": "x" * limits.MAX_SCENE_BYTES}
    with pytest.raises(ValidationError, match=r"scene: .* bytes exceeds the limit 4194304"):
        submit(scene=big)


def test_request_size_limit_and_bad_content_type() -> None:
    with pytest.raises(ValidationError, match=r"request: .* exceeds the limit 5242880"):
        decode_request(b" " * (limits.MAX_REQUEST_BYTES + 1), None, JobRequest)
    with pytest.raises(DecodeError, match="Content-Type"):
        decode_request(b"{}", {"Content-Type": "text/xml"}, JobRequest)
    with pytest.raises(DecodeError, match="not valid JSON"):
        decode_request(b"{nope", None, JobRequest)
    with pytest.raises(DecodeError, match="not valid msgpack"):
        decode_request(b"\xc1", MSGPACK, JobRequest)


def test_frame_range() -> None:
    assert list(limits.frame_range(3, 5)) == [3, 4, 5]
    assert len(limits.frame_range(0, 999)) == 1000
    with pytest.raises(ValidationError, match=r"frames: 1001 is outside the limit 1\.\.1000"):
        limits.frame_range(0, 1000)
    with pytest.raises(ValidationError, match="frame"):
        limits.frame_range(5, 4)


def test_job_requests() -> None:
    assert decode_request(b'{"job_id": "0190-ab_c"}', None, JobRequest).job_id == "0190-ab_c"
    for bad in (b'{"job_id": "a.b"}', b'{"job_id": "a*"}', b'{"job_id": ""}'):
        with pytest.raises(ValidationError, match="job_id"):
            decode_request(bad, None, JobRequest)
    with pytest.raises(DecodeError, match="job_id: required"):
        decode_request(b"{}", None, JobRequest)
    assert api.StatusRequest is api.CancelRequest is api.RetryRequest is JobRequest


def test_list_request() -> None:
    req = decode_request(b'{"state": "completed", "limit": 5}', None, ListRequest)
    assert (req.state, req.limit, req.cursor) == (JobState.COMPLETED, 5, None)
    assert decode_request(b"{}", None, ListRequest).limit == 100
    with pytest.raises(ValidationError, match="state: 'done' is not one of queued"):
        decode_request(b'{"state": "done"}', None, ListRequest)
    with pytest.raises(ValidationError, match=r"limit: 1001 is outside the limit 1\.\.1000"):
        decode_request(b'{"limit": 1001}', None, ListRequest)


def test_dlq_requests() -> None:
    req = decode_request(b'{"dry_run": true, "rate": 5}', None, DlqRequeueRequest)
    assert (req.job_id, req.dry_run, req.rate, req.limit) == (None, True, 5, 10_000)
    with pytest.raises(DecodeError, match="dry_run: expected a boolean"):
        decode_request(b'{"dry_run": 1}', None, DlqRequeueRequest)
    with pytest.raises(ValidationError, match=r"rate: 0 is outside the limit 1\.\.1000"):
        decode_request(b'{"rate": 0}', None, DlqRequeueRequest)
    assert decode_request(b'{"all": true}', None, DlqPurgeRequest).all
    assert decode_request(b'{"job_id": "j"}', None, DlqPurgeRequest).job_id == "j"
    for bad in (b"{}", b'{"job_id": "j", "all": true}'):
        with pytest.raises(ValidationError, match="exactly one of job_id or all"):
            decode_request(bad, None, DlqPurgeRequest)


def test_every_api_error_is_terminal() -> None:
    assert issubclass(DecodeError, TerminalError) and issubclass(ValidationError, TerminalError)
