"""Idempotency keys follow the logical identity; fingerprints catch a reused client key."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto.api import SubmitRequest, decode_request
from proto.idempotency import (
    derived_idempotency_key,
    idempotency_key,
    request_fingerprint,
    scene_hash,
)

from .strategies import dumped

SCENE = {"objects": [{"sphere": {"c": [0, 1.0, -2], "r": 0.5}}], "camera": {"fov": 40}}


def req(**changes: Any) -> SubmitRequest:
    base = {"project": "demo", "scene": SCENE, "width": 64, "height": 64, "spp": 8}
    return SubmitRequest(**{**base, **changes})


def test_defaults_key_order_and_float_forms_do_not_change_the_key() -> None:
    explicit = req(frame=0, tile_size=64, max_depth=64, seed=0)
    reordered = {"camera": {"fov": 40.0}, "objects": [{"sphere": {"r": 0.5, "c": [0.0, 1, -2]}}]}
    body = dumped({"spp": 8, "height": 64, "width": 64, "scene": reordered, "project": "demo"})
    parsed = decode_request(body, None, SubmitRequest)
    assert idempotency_key(explicit) == idempotency_key(parsed) == idempotency_key(req())
    assert request_fingerprint(explicit) == request_fingerprint(parsed)


@pytest.mark.parametrize(
    "change",
    [
        {"project": "other"},
        {"scene": "cornell"},
        {"scene": {**SCENE, "camera": {"fov": 41}}},
        {"width": 65},
        {"height": 63},
        {"spp": 9},
        {"frame": 1},
        {"tile_size": 32},
        {"max_depth": 4},
        {"seed": 1},
    ],
)
def test_every_identity_field_changes_the_key(change: dict[str, Any]) -> None:
    assert idempotency_key(req(**change)) != idempotency_key(req())
    assert request_fingerprint(req(**change)) != request_fingerprint(req())


def test_client_key_is_scoped_by_project_and_distinct_from_derived() -> None:
    mine = req(idempotency_key="order-17")
    assert idempotency_key(mine) == idempotency_key(req(idempotency_key="order-17", spp=99))
    assert idempotency_key(mine) != idempotency_key(req(idempotency_key="order-18"))
    other_project = req(project="other", idempotency_key="order-17")
    assert idempotency_key(mine) != idempotency_key(other_project)
    assert idempotency_key(mine) != derived_idempotency_key(mine)
    assert len(idempotency_key(mine)) == 64


def test_same_client_key_different_body_has_different_fingerprint() -> None:
    first, second = req(idempotency_key="k1"), req(idempotency_key="k1", spp=16)
    assert idempotency_key(first) == idempotency_key(second)
    assert request_fingerprint(first) != request_fingerprint(second)
    assert request_fingerprint(first) == request_fingerprint(replace(first, idempotency_key="k2"))


def test_builtin_and_inline_scenes_never_collide() -> None:
    assert scene_hash("cornell") != scene_hash({"builtin": "cornell"})


@given(spp=st.integers(1, 65536), seed=st.integers(0, 2**32 - 1))
def test_key_is_a_function_of_the_settings(spp: int, seed: int) -> None:
    a, b = req(spp=spp, seed=seed), req(spp=spp, seed=seed)
    assert idempotency_key(a) == idempotency_key(b)
    assert (idempotency_key(a) == idempotency_key(req())) == ((spp, seed) == (8, 0))
