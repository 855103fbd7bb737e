"""Internal message schemas: round-trips, and garbage only ever raises DecodeError."""

from __future__ import annotations

import dataclasses
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
    Room,
    TileDone,
    TileMessage,
    TilesDone,
    header_value,
)
from proto.names import EventKind
from shared.core.errors import DecodeError
from shared.core.runs import MAX_RUN

from .strategies import indices, msgpack_values, mutated_maps, packed, tokens

SCHEMAS: list[type[Message]] = [
    JobMessage, TileMessage, TileDone, TilesDone, JobEvent, DeadLetter, Room
]  # fmt: skip
text = st.text(max_size=100)
job_kinds = st.sampled_from(
    [k for k in EventKind if k not in (EventKind.TILE_DONE, EventKind.TILES_DONE)]
)

MESSAGES: dict[type[Message], st.SearchStrategy[Any]] = {
    JobMessage: st.builds(JobMessage, tokens, indices),
    TileMessage: st.builds(TileMessage, tokens, indices, indices, st.integers(1, MAX_RUN)),
    TileDone: st.builds(TileDone, tokens, indices, tokens, text, text),
    TilesDone: st.builds(TilesDone, tokens, indices),
    JobEvent: st.builds(JobEvent, tokens, job_kinds, indices, text, st.none() | text),
    DeadLetter: st.builds(
        DeadLetter, tokens, tokens, text, text, tokens, indices, indices, text, st.binary()
    ),
    Room: st.builds(Room, st.integers(1, 2**63 - 1)),
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
    # the wire bytes: "v" first, then every field in declaration order, enums by value; a
    # field added later is left out while it holds its default
    omitted = schema.OMITTED_AT_DEFAULT
    fields = {k: v.value if isinstance(v, EventKind) else v
              for k, v in dataclasses.asdict(message).items()
              if k not in omitted or v != omitted[k]}  # fmt: skip
    assert encoded == msgpack.packb({"v": schema.VERSION, **fields}, use_bin_type=True)


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
    with pytest.raises(DecodeError, match="TilesDone"):
        JobEvent.decode(packed({"v": 1, "job_id": "j", "kind": "tiles-done"}))
    with pytest.raises(DecodeError, match="unknown event kind"):
        JobEvent.decode(packed({"v": 1, "job_id": "j", "kind": "exploded"}))


JOB = "0196a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            JobMessage(JOB, 2),
            {"Tessera-Kind": "job", "Tessera-Job": JOB, "Tessera-Generation": "2"},
        ),
        (
            TileMessage(JOB, 7, 1),
            {"Tessera-Kind": "tile", "Tessera-Job": JOB, "Tessera-Tile": "7",
             "Tessera-Generation": "1"},
        ),
        (
            TileDone(JOB, 11, "a1b2", "tiles/x.npy", "h"),
            {"Tessera-Kind": "tile-done", "Tessera-Job": JOB, "Tessera-Tile": "11",
             "Tessera-Attempt": "a1b2"},
        ),
        (TilesDone(JOB, 40), {"Tessera-Kind": "tiles-done", "Tessera-Job": JOB}),
        (
            JobEvent(JOB, EventKind.JOB_COMPLETED, 3, "done", "renders/x.png"),
            {"Tessera-Kind": "job-completed", "Tessera-Job": JOB, "Tessera-Generation": "3"},
        ),
        (
            DeadLetter(JOB, "tile-4", "max_deliveries", "boom\nline 2", "TILES", 42, 5,
                       "tessera.tiles.x.4", b"\x81"),
            {"Tessera-Kind": "dead-letter", "Tessera-Job": JOB, "Tessera-Unit": "tile-4",
             "Tessera-Tile": "4", "Tessera-Reason": "max_deliveries",
             "Tessera-Source": "TILES:42", "Tessera-Deliveries": "5"},
        ),
        (
            DeadLetter(JOB, "final", "invalid", "", "EVENTS", 9, 1, "s", b""),
            {"Tessera-Kind": "dead-letter", "Tessera-Job": JOB, "Tessera-Unit": "final",
             "Tessera-Reason": "invalid", "Tessera-Source": "EVENTS:9",
             "Tessera-Deliveries": "1"},
        ),
        (Room(3), {"Tessera-Kind": "room"}),
    ],
)  # fmt: skip
def test_headers_name_each_kind(message: Message, expected: dict[str, str]) -> None:
    assert message.headers() == expected


@given(data=st.data())
@pytest.mark.parametrize("schema", SCHEMAS)
def test_headers_are_always_valid_header_values(schema: type[Message], data: Any) -> None:
    """Whatever the body, header values are 1..128 printable ASCII characters (no CR/LF)."""
    message = data.draw(MESSAGES[schema])
    headers = message.headers()
    # every message of a job names it (a Room names no job)
    assert headers.get("Tessera-Job") == getattr(message, "job_id", None)
    for key, value in headers.items():
        assert key.startswith("Tessera-")
        assert 1 <= len(value) <= 128
        assert all("!" <= c <= "~" for c in value), value


def test_a_room_counts_at_least_one_tile() -> None:
    with pytest.raises(DecodeError, match="Room: tiles must be at least 1"):
        Room.decode(packed({"v": 1, "tiles": 0}))
    assert Room.decode(packed({"v": 1, "tiles": 16})) == Room(16)


def test_header_value_replaces_what_a_header_cannot_carry() -> None:
    assert header_value("a b\r\nc") == "a_b_c"
    assert header_value("") == "-"
    assert len(header_value("x" * 500)) == 128


def test_a_single_tile_message_is_the_bytes_it_was_before_runs() -> None:
    # a worker from before runs decodes every message that is not a run (a rolling upgrade)
    before = {"v": 1, "job_id": "j1", "tile_index": 3, "generation": 2}
    assert TileMessage("j1", 3, 2).encode() == msgpack.packb(before, use_bin_type=True)
    assert msgpack.unpackb(TileMessage("j1", 3, 2, 4).encode())["run"] == 4


def test_a_run_names_its_tiles_and_is_bounded() -> None:
    run = TileMessage("j1", 3, 2, 4)
    assert list(run.tiles) == [3, 4, 5, 6]
    assert run.single(5) == TileMessage("j1", 5, 2)
    assert run.headers()["Tessera-Run"] == "4"
    assert "Tessera-Run" not in TileMessage("j1", 3, 2).headers()
    with pytest.raises(ValueError, match="not in the run"):
        run.single(7)
    for bad in (0, MAX_RUN + 1):
        body = msgpack.packb({"v": 1, "job_id": "j1", "tile_index": 3, "run": bad})
        with pytest.raises(DecodeError, match="run"):
            TileMessage.decode(body)
