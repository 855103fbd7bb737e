"""The documented contract and the code are one: docs/api.md, the docstring tables, the schemas."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import orjson
import pytest

import proto.api
import proto.api_replies
from proto.api import REQUEST_SCHEMAS, VERB_REQUESTS
from proto.api_replies import (
    ITEM_SCHEMAS,
    REPLY_SCHEMAS,
    VERB_REPLIES,
    DeadLetterView,
    DlqListReply,
    JobSummary,
    ListReply,
    encode_reply,
    field_docs,
    reply_fields,
)
from proto.apidoc import error_code_docs, json_type, render
from proto.names import ApiVerb
from proto.replies import ErrorCode
from shared.core.lifecycle import TERMINAL_JOB_STATES, JobState

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_api_page_is_generated_from_the_definitions() -> None:
    assert DOCS.read_text() == render(), "regenerate: python -m proto.apidoc > docs/api.md"


def test_every_verb_has_a_request_and_a_reply_schema() -> None:
    assert set(VERB_REQUESTS) == set(VERB_REPLIES) == set(ApiVerb)
    assert set(VERB_REQUESTS.values()) == set(REQUEST_SCHEMAS)


@pytest.mark.parametrize("schema", [*REPLY_SCHEMAS, *REQUEST_SCHEMAS], ids=lambda s: s.__name__)
def test_every_field_is_documented_with_a_json_type(schema: type) -> None:
    docs = field_docs(schema)
    assert tuple(docs) == reply_fields(schema)
    for name, (tp, text) in docs.items():
        assert text.strip(), f"{schema.__name__}.{name} has no documentation"
        json_type(tp)  # raises for a type the docs cannot name
    assert dataclasses.fields(schema) and schema.__dataclass_params__.frozen  # type: ignore[attr-defined]


def _table(doc: str) -> dict[str, list[str]]:
    """schema name -> field names of a ``subject | schema | fields`` docstring table."""
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("====")]
    rows: dict[str, list[str]] = {}
    current = None
    for line in lines[rules[1] + 1 : rules[-1]]:  # the body, below the header row
        name = line[26:46].strip()
        if name:
            current = name
            rows[current] = []
        if current is not None:
            rows[current].append(line[46:])
    return {
        name: [f.strip() for f in re.sub(r"\([^)]*\)", "", " ".join(cells)).split(",") if f.strip()]
        for name, cells in rows.items()
    }


def test_the_reply_table_lists_exactly_each_schema_s_fields() -> None:
    table = _table(proto.api_replies.__doc__ or "")
    assert set(table) == {s.__name__ for s in REPLY_SCHEMAS}
    for schema in REPLY_SCHEMAS:
        inherited = [b for b in schema.__mro__[1:] if dataclasses.is_dataclass(b)]
        expected = list(reply_fields(schema))
        if inherited:  # "(Base's), own fields"
            expected = expected[len(reply_fields(inherited[0])) :]
        assert table[schema.__name__] == expected, schema.__name__


def test_the_request_table_lists_exactly_each_schema_s_fields() -> None:
    table = _table(proto.api.__doc__ or "")
    assert set(table) == {s.__name__ for s in REQUEST_SCHEMAS}
    for schema in REQUEST_SCHEMAS:
        assert table[schema.__name__] == list(reply_fields(schema)), schema.__name__


def test_the_page_names_exactly_the_final_states_of_the_lifecycle() -> None:
    section = render().split("## Job states", 1)[1].split("##", 1)[0]
    final = section.split("**Final states**", 1)[1].split(":", 1)[1].split(".", 1)[0]
    assert set(re.findall(r"`([a-z_]+)`", final)) == {s.value for s in TERMINAL_JOB_STATES}
    assert {s.value for s in JobState} <= set(re.findall(r"`([a-z_]+)`", section))


def test_every_error_code_is_documented() -> None:
    docs = error_code_docs()
    assert set(docs) == set(ErrorCode) and all(docs.values())
    for code in ErrorCode:
        assert f"| `{code.value}` |" in render()


def test_encode_reply_writes_every_field_nested_ones_too() -> None:
    summary = JobSummary("j", "p", "queued", 0, 4, 4, 1, 0, "t", "t", None, 50, None, "tessera")
    reply = orjson.loads(encode_reply(ListReply(jobs=[summary], next_cursor=None)))
    assert list(reply) == ["ok", *reply_fields(ListReply)] and reply["ok"] is True
    assert list(reply["jobs"][0]) == list(reply_fields(JobSummary))
    letter = DeadLetterView(1, "s", None, "not msgpack", *[None] * 8)
    listed = orjson.loads(encode_reply(DlqListReply(dead_letters=[letter], next_cursor=None)))
    assert listed["dead_letters"][0]["job_id"] is None, "null, not left out"


def test_a_reply_cannot_carry_a_field_outside_its_schema_or_miss_one() -> None:
    with pytest.raises(TypeError):
        ListReply(jobs=[], next_cursor=None, extra=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ListReply(jobs=[])  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        encode_reply({"jobs": []})  # type: ignore[arg-type]


def test_item_schemas_are_the_ones_replies_nest() -> None:
    nested = set()
    for schema in VERB_REPLIES.values():
        for tp, _ in field_docs(schema).values():
            inner = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
            if dataclasses.is_dataclass(inner):
                nested.add(inner)
    assert nested | {JobSummary} == set(ITEM_SCHEMAS) | {JobSummary}
