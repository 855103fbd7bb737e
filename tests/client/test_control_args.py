"""Client-side checks of the job-control options: usage errors (exit 2) before anything is sent."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from services.client import argtypes

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "after"),
    [("30s", timedelta(seconds=30)), ("90m", timedelta(minutes=90)), ("2h", timedelta(hours=2)),
     ("1d", timedelta(days=1)), ("2026-01-01T14:00:00+01:00", timedelta(hours=1))],
)  # fmt: skip
def test_deadline_is_relative_or_absolute_and_sent_as_utc(raw: str, after: timedelta) -> None:
    wire = argtypes.deadline(raw, now=NOW)
    assert datetime.fromisoformat(wire) == NOW + after
    assert datetime.fromisoformat(wire).utcoffset() == timedelta(0)


@pytest.mark.parametrize("raw", ["0s", "yesterday", "2025-12-31T00:00:00Z", "2027-01-01T00:00"])
def test_bad_deadlines_are_usage_errors(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.deadline(raw, now=NOW)


@pytest.mark.parametrize("raw", ["101", "-1", "x"])
def test_priority_outside_0_to_100_is_a_usage_error(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.priority(raw)


def test_weight_and_cap() -> None:
    assert argtypes.weight("2.5") == 2.5 and argtypes.max_in_flight("none") is None
    assert argtypes.max_in_flight("3") == 3
    for bad in ("0", "-1", "inf", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            argtypes.weight(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.max_in_flight("0")
