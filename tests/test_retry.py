"""Backoff: exponential, capped, jittered downwards; one policy type for every retry loop."""

from __future__ import annotations

import pytest

from shared.core.retry import RetryPolicy, backoff


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(base=0.1, cap=1.0, jitter=0.0)
    assert [backoff(policy, i) for i in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff(policy, 10_000) == 1.0, "no overflow however many attempts"


def test_jitter_only_shortens_and_stays_within_its_fraction() -> None:
    policy = RetryPolicy(base=1.0, cap=1.0, jitter=0.2)
    assert backoff(policy, 1, rand=0.0) == 1.0
    assert backoff(policy, 1, rand=0.999999) == pytest.approx(0.8, abs=1e-5)
    draws = {backoff(policy, 1) for _ in range(200)}
    assert all(0.8 <= d <= 1.0 for d in draws) and len(draws) > 1


@pytest.mark.parametrize(
    "policy", [{"base": -1.0}, {"base": 2.0, "cap": 1.0}, {"jitter": 1.5}, {"jitter": -0.1}]
)
def test_invalid_policies_are_refused(policy: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**({"base": 1.0, "cap": 30.0} | policy))


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError):
        backoff(RetryPolicy(base=1.0, cap=60.0), 0)
