"""Canonical JSON: invariant under key order and formatting, sensitive to every value."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto.canonical import MAX_DEPTH, canonical_hash, canonical_json
from shared.core.errors import ValidationError

from .strategies import json_values


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same value with every object's keys in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


@given(value=json_values, seed=st.integers())
def test_invariant_under_key_order_and_whitespace(value: Any, seed: int) -> None:
    reordered = shuffled(value, random.Random(seed))
    assert canonical_json(reordered) == canonical_json(value)
    pretty = json.loads(json.dumps(reordered, indent=3, separators=(" , ", " :  ")))
    assert canonical_hash(pretty) == canonical_hash(value)


@given(value=json_values)
def test_is_json_that_parses_back_to_the_normalised_value(value: Any) -> None:
    text = canonical_json(value)
    outside_strings = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', text)
    assert not re.search(rb"\s", outside_strings)
    assert canonical_json(orjson.loads(text)) == text


def test_numbers_are_normalised() -> None:
    assert canonical_json({"b": 1.0, "a": -0.0, "c": [2.5, 10**18]}) == (
        b'{"a":0,"b":1,"c":[2.5,1000000000000000000]}'
    )
    assert canonical_json(True) == b"true" and canonical_json(1) == b"1"
    assert canonical_json((1, "é")) == '[1,"é"]'.encode()
    assert canonical_json([2.0**60, 2**60]) == b"[1152921504606846976,1152921504606846976]"
    assert canonical_json([1e300, 2.0**63]) == b"[1e+300,9.223372036854776e+18]"


@given(value=json_values, data=st.data())
def test_sensitive_to_any_leaf_change(value: Any, data: st.DataObject) -> None:
    changed = {"root": value, "leaf": data.draw(st.integers(0, 100))}
    other = {"root": value, "leaf": changed["leaf"] + 1}
    assert canonical_hash(changed) != canonical_hash(other)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"x": 1}, {"x": 2}),
        ({"x": 1}, {"y": 1}),
        ({"x": 1}, {"x": True}),
        ({"x": 1}, {"x": "1"}),
        ({"x": None}, {}),
        ([1, 2], [2, 1]),
        ({"x": 1.5}, {"x": 1.25}),
        ({"x": [1]}, {"x": 1}),
    ],
)
def test_different_values_hash_differently(a: Any, b: Any) -> None:
    assert canonical_hash(a) != canonical_hash(b)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"a": [float("nan")]}, "$.a[0]: nan is not a finite number"),
        ({"a": float("inf")}, "$.a: inf is not a finite number"),
        ({1: "x"}, "object key 1 is not a string"),
        ({"a": b"x"}, "bytes is not a JSON value"),
        ({"a": 2**63}, "outside the signed 64-bit range"),
        ({"a": "\ud800"}, "not encodable"),
    ],
)
def test_rejects_non_canonical_values(value: Any, text: str) -> None:
    with pytest.raises(ValidationError) as info:
        canonical_json(value)
    assert text in str(info.value)


def test_depth_is_bounded() -> None:
    deep: Any = 0
    for _ in range(MAX_DEPTH):
        deep = [deep]
    canonical_json(deep)
    with pytest.raises(ValidationError, match="nesting deeper than 64"):
        canonical_json([deep])
