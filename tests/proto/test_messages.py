"""Internal message schemas: round-trips, and garbage only ever raises DecodeError."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto.messages import (
    MAX_MESSAGE_BYTES,
    DeadLetter,
    JobEvent,
    JobMessage,
    Message,
    TileDone,
    TileMessage,
)
from proto.names import EventKind
from shared.errors import DecodeError

from .strategies import indices, msgpack_values, mutated_maps, packed, tokens

SCHEMAS: list[type[Message]] = [JobMessage, TileMessage, TileDone, JobEvent, DeadLetter]
text = st.text(max_size=100)
job_kinds = st.sampled_from([k for k in EventKind if k is not EventKind.TILE_DONE])

MESSAGES: dict[type[Message], st.SearchStrategy[Any]] = {
    JobMessage: st.builds(JobMessage, tokens, indices),
    TileMessage: st.builds(TileMessage, tokens, indices, indices),
    TileDone: st.builds(TileDone, tokens, indices, tokens, text, text),
    JobEvent: st.builds(JobEvent, tokens, job_kinds, indices, text, st.none() | text),
    DeadLetter: st.builds(
        DeadLetter, tokens, tokens, text, text, tokens, indices, indices, text, st.binary()
    ),
}
EXAMPLE = {
    "v": 1,
    "job_id": "j1",
    "tile_index": 3,
    "generation": 0,
    "attempt_id": "a1",
    "result_key": "tiles/j1/3",
    "input_hash": "ab",
    "kind": "job-completed",
}


def decode_never_raises_anything_but_decode_error(schema: type[Message], data: bytes) -> None:
    try:
        schema.decode(data)
    except DecodeError as exc:
        assert str(exc).startswith(schema.__name__)


@pytest.mark.parametrize("schema", SCHEMAS)
@given(data=st.data())
def test_round_trip(schema: type[Message], data: st.DataObject) -> None:
    message = data.draw(MESSAGES[schema])
    encoded = message.encode()
    assert schema.decode(encoded) == message
    assert msgpack.unpackb(encoded)["v"] == schema.VERSION


@pytest.mark.parametrize("schema", SCHEMAS)
@given(raw=st.binary(max_size=200))
def test_random_bytes(schema: type[Message], raw: bytes) -> None:
    decode_never_raises_anything_but_decode_error(schema, raw)


@pytest.mark.parametrize("schema", SCHEMAS)
@given(value=msgpack_values)
def test_random_msgpack_structures(schema: type[Message], value: Any) -> None:
    decode_never_raises_anything_but_decode_error(schema, packed(value))


@pytest.mark.parametrize("schema", SCHEMAS)
@given(body=mutated_maps(EXAMPLE))
def test_near_miss_maps(schema: type[Message], body: dict[str, Any]) -> None:
    decode_never_raises_anything_but_decode_error(schema, packed(body))


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"v": 1, "job_id": "j"}, "missing field(s) tile_index"),
        ({"v": 2, "job_id": "j", "tile_index": 1}, "unknown version v=2"),
        ({"v": 1.0, "job_id": "j", "tile_index": 1}, "unknown version"),
        ({"job_id": "j", "tile_index": 1}, "unknown version v=None"),
        ({"v": 1, "job_id": "j", "tile_index": True}, "tile_index: expected an integer"),
        ({"v": 1, "job_id": "j", "tile_index": -1}, "tile_index: expected an integer"),
        ({"v": 1, "job_id": {"x": 1}, "tile_index": 1}, "job_id: expected a string"),
        ({"v": 1, "job_id": "a.b", "tile_index": 1}, "job_id: 'a.b' is not a token"),
        ({"v": 1, "job_id": "j", "tile_index": 1, "x": 0}, "unknown field(s) 'x'"),
        ([1, "j", 1], "expected a map, got list"),
    ],
)
def test_decode_errors_name_the_problem(body: Any, problem: str) -> None:
    with pytest.raises(DecodeError) as info:
        TileMessage.decode(packed(body))
    assert problem in str(info.value)


def test_not_msgpack_and_oversized() -> None:
    with pytest.raises(DecodeError, match="not msgpack"):
        JobMessage.decode(b"\xc1")
    with pytest.raises(DecodeError, match="exceeds limit"):
        JobMessage.decode(b"\x00" * (MAX_MESSAGE_BYTES + 1))
    with pytest.raises(DecodeError, match="expected bytes"):
        JobMessage.decode("text")  # type: ignore[arg-type]


def test_job_event_kind_is_an_enum_and_not_tile_done() -> None:
    event = JobEvent.decode(JobEvent("j", EventKind.JOB_FAILED, detail="boom").encode())
    assert event.kind is EventKind.JOB_FAILED
    with pytest.raises(DecodeError, match="TileDone"):
        JobEvent.decode(packed({"v": 1, "job_id": "j", "kind": "tile-done"}))
    with pytest.raises(DecodeError, match="unknown event kind"):
        JobEvent.decode(packed({"v": 1, "job_id": "j", "kind": "exploded"}))
