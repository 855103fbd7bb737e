"""``tile_size: "auto"``: the edge rule (:func:`proto.limits.auto_tile_edge`) and the wire form."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto.api import SubmitRequest, decode_request
from proto.idempotency import cost_key, idempotency_key
from proto.limits import (
    AUTO_TILE_MAX,
    AUTO_TILE_MIN,
    MAX_TILES,
    TILE_AUTO,
    auto_tile_edge,
    tile_count,
)
from shared.core.errors import DecodeError

BASE: dict[str, Any] = {"project": "p", "scene": "cornell", "width": 512, "height": 512, "spp": 64}


def test_a_tile_takes_about_the_target_time_at_the_measured_cost() -> None:
    # 1e-6 s per pixel-sample at 64 spp: 2 s is 31,250 pixels, an edge of 176.8 -> 176
    edge = auto_tile_edge(512, 512, 64, seconds_per_sample=1e-6, target_seconds=2.0, threads=2)
    assert edge == 176
    assert edge * edge * 64 * 1e-6 == pytest.approx(2.0, rel=0.05)
    # four times the cost: half the edge
    quarter = auto_tile_edge(512, 512, 64, seconds_per_sample=4e-6, target_seconds=2.0, threads=2)
    assert quarter == 88


def test_every_thread_gets_a_tile_and_the_bounds_hold() -> None:
    cheap: dict[str, Any] = {"seconds_per_sample": 1e-9, "target_seconds": 2.0}
    # alone it would be one 512-px tile; 16 threads need 16 tiles of the 512x512 image
    assert auto_tile_edge(512, 512, 64, threads=1, **cheap) == 512
    edge = auto_tile_edge(512, 512, 64, threads=16, **cheap)
    assert edge == 128 and tile_count(512, 512, edge) == 16  # 4x4, not 168 px and slivers
    # a tiny image never gets more tiles than the minimum edge allows
    assert auto_tile_edge(20, 20, 1, threads=64, **cheap) == AUTO_TILE_MIN
    # no larger than the image, rounded up to the step
    assert auto_tile_edge(100, 60, 1, threads=1, **cheap) == 104
    # very expensive: the minimum edge, and never more than MAX_TILES tiles
    dear = auto_tile_edge(8192, 8192, 65536, seconds_per_sample=1.0, target_seconds=2.0, threads=1)
    assert tile_count(8192, 8192, dear) <= MAX_TILES and dear >= AUTO_TILE_MIN
    # POV-Ray's edges are whole render blocks
    assert auto_tile_edge(800, 600, 1, seconds_per_sample=1e-5, target_seconds=2.0, threads=2,
                          step=32) % 32 == 0  # fmt: skip


@given(
    width=st.integers(1, 8192),
    height=st.integers(1, 8192),
    spp=st.integers(1, 65536),
    cost=st.floats(1e-12, 10.0),
    target=st.floats(0.01, 600.0),
    threads=st.integers(1, 512),
    step=st.sampled_from([8, 32]),
)
def test_the_edge_is_always_valid(
    width: int, height: int, spp: int, cost: float, target: float, threads: int, step: int
) -> None:
    edge = auto_tile_edge(width, height, spp, seconds_per_sample=cost, target_seconds=target,
                          threads=threads, step=step)  # fmt: skip
    assert edge % step == 0
    assert 1 <= tile_count(width, height, edge) <= MAX_TILES
    assert edge >= AUTO_TILE_MIN or edge == math.ceil(AUTO_TILE_MIN / step) * step
    # at the upper bound, or where a larger edge would have cost a thread its tile
    if edge > max(AUTO_TILE_MAX, -(-max(width, height) // step) * step):
        assert tile_count(width, height, edge - step) > MAX_TILES
    smaller = edge - step
    if smaller >= AUTO_TILE_MIN and tile_count(width, height, edge) < threads:
        pytest.fail(f"edge {edge} leaves threads idle while {smaller} would not be the minimum")


def test_auto_on_the_wire_and_in_the_keys() -> None:
    auto = decode_request(_json({**BASE, "tile_size": "auto"}), None, SubmitRequest)
    assert auto.tile_size == TILE_AUTO
    explicit = decode_request(_json({**BASE, "tile_size": 64}), None, SubmitRequest)
    assert idempotency_key(auto) != idempotency_key(explicit), "auto is its own logical request"
    assert cost_key(auto) == cost_key(explicit), "but a pixel-sample costs the same"
    assert cost_key(auto) != cost_key(SubmitRequest(**{**BASE, "max_depth": 4}))
    assert auto.to_body()["tile_size"] == "auto"
    for bad in ("big", "AUTO", ""):
        with pytest.raises(DecodeError, match="tile_size: expected an integer or 'auto'"):
            decode_request(_json({**BASE, "tile_size": bad}), None, SubmitRequest)


def _json(body: dict[str, Any]) -> bytes:
    import orjson

    return orjson.dumps(body)
