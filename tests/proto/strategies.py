"""Hypothesis strategies shared by the proto tests."""

from __future__ import annotations

import json
from typing import Any

import msgpack
from hypothesis import strategies as st

tokens = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
indices = st.integers(0, 2**63 - 1)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


def trees(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Nested lists/maps over ``leaves``."""
    return st.recursive(
        leaves,
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
        ),
        max_leaves=20,
    )


json_values = trees(json_scalars)
msgpack_values = trees(scalars | st.binary(max_size=8))


def mutated_maps(template: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Maps near ``template``: fields dropped, replaced by random values, or added."""
    fields = {k: msgpack_values | st.just(v) for k, v in template.items()}
    return st.fixed_dictionaries({}, optional={**fields, "extra": msgpack_values})


def packed(value: Any) -> bytes:
    packed_bytes: bytes = msgpack.packb(value, use_bin_type=True)
    return packed_bytes


def dumped(value: Any) -> bytes:
    """JSON via the stdlib: big ints survive, NaN becomes the invalid token ``NaN``."""
    return json.dumps(value, default=repr).encode()
