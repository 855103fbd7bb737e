"""Pure parts of the operator tools: pacing, durations, rates, requeue plans."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import pytest

from services.cli.ops.gc import parse_age
from services.client.recovery import parse_rate
from shared.core.errors import ValidationError
from shared.core.lifecycle import JobState
from shared.metadata import Job
from shared.service.pacing import Pacer
from shared.service.requeue import Plan, _plan_job


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


@pytest.mark.parametrize("raw", ["", "h", "-1h", "soon", "nan", "inf", "1e400s", "nanm"])
def test_parse_age_refuses(raw: str) -> None:
    with pytest.raises(ValidationError, match=repr(raw)):
        parse_age(raw)


def test_parse_rate() -> None:
    assert parse_rate("10/s") == parse_rate("10") == 10
    for bad in ("0", "fast", "1.5/s"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rate(bad)


def _job(state: JobState, generation: int) -> Job:
    now = datetime.now(UTC)
    return Job(
        job_id="j", idempotency_key="k", fingerprint="f", project="p", request={}, scene={},
        frame=0, input_hash="h", width=16, height=16, spp=1, tile_size=16, tiles_total=1,
        state=state, generation=generation, cancel_requested=False, result_location=None,
        result_sha256=None, float_location=None, last_error_code=None, last_error=None,
        created_at=now, updated_at=now, finished_at=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "generation", "action"),
    [
        (JobState.DEAD_LETTERED, 0, "requeue"),
        (JobState.FAILED_TERMINAL, 3, "requeue"),
        # an older letter of a job some other letter already retried: publish again, delete
        (JobState.QUEUED, 1, "replay"),
        (JobState.RUNNING, 1, "replay"),
        (JobState.FINALIZING, 2, "replay"),
        # never retried, still live: the letter stays for the operator
        (JobState.RUNNING, 0, "skip"),
        (JobState.COMPLETED, 1, "skip"),
        (JobState.CANCELLED, 1, "skip"),
    ],
)
@pytest.mark.parametrize("unit", ["job", "final"])
def test_job_and_final_letters_are_planned_alike(
    unit: str, state: JobState, generation: int, action: str
) -> None:
    base = Plan(1, "j", unit, "max_deliveries", "e", "skip", "")
    assert _plan_job(base, _job(state, generation)).action == action
