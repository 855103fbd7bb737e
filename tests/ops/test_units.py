"""Pure parts of the operator tools: pacing, durations, rates."""

from __future__ import annotations

import argparse

import pytest

from services.client.recovery import parse_rate
from services.ops.gc import parse_age
from services.ops.pacing import Pacer
from shared.errors import ValidationError


async def test_pacer_spaces_actions_without_bursts() -> None:
    now = [100.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pacer = Pacer(4, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        await pacer.wait()
    assert slept == [0.25] * 4, "the first goes at once, then one every 1/rate seconds"
    now[0] += 10  # idle for a while: no burst is saved up
    await pacer.wait()
    await pacer.wait()
    assert slept[-1] == 0.25 and len(slept) == 5


@pytest.mark.parametrize(
    ("raw", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("1h", 3600), ("2d", 172800)]
)
def test_parse_age(raw: str, seconds: float) -> None:
    assert parse_age(raw) == seconds


@pytest.mark.parametrize("raw", ["", "h", "-1h", "soon"])
def test_parse_age_refuses(raw: str) -> None:
    with pytest.raises(ValidationError):
        parse_age(raw)


def test_parse_rate() -> None:
    assert parse_rate("10/s") == parse_rate("10") == 10
    for bad in ("0", "fast", "1.5/s"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rate(bad)
