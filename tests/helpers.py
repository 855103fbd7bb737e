"""Test helpers: the one bounded polling helper, and a process check.

Tests never sleep to synchronise; they poll. :func:`eventually` (in a coroutine; the predicate
may be sync or async) and :func:`eventually_sync` (plain code: subprocesses, threads, queues) are
one helper in two forms with the same contract:

- ``predicate`` is called until it returns something truthy, and that value is returned (so a
  wait can hand over what it found: ``row = await eventually(lambda: db.get(x), what=...)``);
- every wait is bounded by ``timeout`` seconds and names what it awaited: on time-out the test
  fails with ``AssertionError("<what> did not hold within <timeout> s (last: <value>)")``,
  followed by ``detail()`` if given (the chaos rig passes its service logs);
- an exception raised by the predicate propagates at once: a broken check fails loudly instead
  of being retried until the deadline, and ``assert proc.alive()`` inside a predicate ends the
  wait as soon as the process it waits on dies.

The predicate is called at least once, even with ``timeout=0``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
"""Seconds a wait lasts when the caller names no bound."""
DEFAULT_INTERVAL = 0.05
"""Seconds between two calls of the predicate."""


def _timed_out(what: str, timeout: float, last: object, detail: Callable[[], str] | None) -> str:
    message = f"{what} did not hold within {timeout:g} s (last: {last!r})"
    return message if detail is None else f"{message}\n{detail()}"


@overload
async def eventually(
    predicate: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    detail: Callable[[], str] | None = None,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T | None],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    detail: Callable[[], str] | None = None,
) -> T: ...


async def eventually(
    predicate: Callable[[], Any],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Await until ``predicate()`` (sync or async) is truthy; its value (see the module doc)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(what, timeout, value, detail))
        await asyncio.sleep(interval)


def eventually_sync(
    predicate: Callable[[], T | None],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    detail: Callable[[], str] | None = None,
) -> T:
    """:func:`eventually` for synchronous code: blocks the calling thread between polls."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(what, timeout, value, detail))
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True if a process with this PID exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
