"""Retry policy as data; backoff as a pure function of the attempt number."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy", "backoff"]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with a cap and proportional jitter.

    ``attempt`` 1 waits about ``base``, attempt 2 about ``2 * base``, ... never more than
    ``cap``. ``jitter`` is the fraction of the delay that is randomised (0 = none), so that
    tiles failing together do not come back together. ``base`` and ``cap`` have no default: each
    use names its own (a service's ``nak`` backoff is ``TESSERA_RETRY_BASE`` /
    ``TESSERA_RETRY_CAP``, :meth:`shared.core.config.DeliverySettings.retry_policy`).
    """

    base: float
    cap: float
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not (0 <= self.base <= self.cap) or not (0 <= self.jitter <= 1):
            raise ValueError(f"invalid retry policy {self}")


def backoff(policy: RetryPolicy, attempt: int, *, rand: float | None = None) -> float:
    """Delay in seconds before retry number ``attempt`` (1-based).

    ``rand`` in [0, 1) replaces the random draw (tests pass it to get exact values).
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    delay = min(policy.cap, policy.base * 2.0 ** min(attempt - 1, 62))
    r = random.random() if rand is None else rand
    return delay * (1.0 - policy.jitter * r)
