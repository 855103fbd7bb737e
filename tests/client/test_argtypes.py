"""The CLI's positive-number converters."""

from __future__ import annotations

import argparse

import pytest

from services.client.argtypes import positive_float, positive_int, tile_size
from services.client.output import status_text


@pytest.mark.parametrize(("raw", "value"), [("1", 1.0), ("0.25", 0.25), (" 2e1 ", 20.0)])
def test_positive_float_takes_finite_positive_numbers(raw: str, value: float) -> None:
    assert positive_float(raw) == value


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "-inf", "1s", ""])
def test_positive_float_refuses_the_rest(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(raw)):
        positive_float(raw)


@pytest.mark.parametrize("raw", ["0", "-3", "1.5", "two", ""])
def test_positive_int_refuses_non_counts(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(raw)):
        positive_int(raw)
    assert positive_int("3") == 3


def test_tile_size_is_auto_or_an_edge_within_the_limits() -> None:
    assert tile_size("auto") == tile_size(" AUTO ") == "auto"
    assert tile_size("64") == 64
    for raw in ("7", "1025", "0", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(raw)):
            tile_size(raw)


def test_status_shows_the_edge_the_scheduler_picked() -> None:
    base = {"job_id": "j", "state": "running", "generation": 0, "project": "p", "frame": 0,
            "width": 64, "height": 48, "spp": 8, "tiles_done": 0, "tiles_total": 0,
            "samples_done": 0, "samples_total": 0, "created_at": "2026-12-02T00:00:00Z",
            "updated_at": "2026-12-02T00:00:00Z"}  # fmt: skip
    assert "tiles of 16\n" in status_text(base | {"tile_size": 16, "tile_auto": False}) + "\n"
    assert "tiles of auto (not planned yet)" in status_text(
        base | {"tile_size": 0, "tile_auto": True}
    )
    assert "tiles of 176 (auto)" in status_text(base | {"tile_size": 176, "tile_auto": True})
