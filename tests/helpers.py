"""Test helpers: bounded polling instead of sleeps."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def eventually(
    predicate: Callable[[], Any],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; return that value.

    Fails the test with ``what`` if it is still falsy after ``timeout`` seconds. Exceptions
    raised by the predicate propagate (a broken check should fail loudly, not be retried).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not hold within {timeout:g} s (last: {value!r})")
        await asyncio.sleep(interval)


def eventually_sync(
    predicate: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> T:
    """Synchronous :func:`eventually`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what or 'condition'} did not hold within {timeout:g} s")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True if a process with this PID exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
