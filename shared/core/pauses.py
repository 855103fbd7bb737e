"""Named pause points for in-process race tests: the test's coroutine runs at the point.

A crash point (:mod:`shared.core.crash`) kills a process where a step is half done; a pause point
lets a test that drives a component in-process put a real concurrent action (another writer's
commit, a message acked) at one exact place in it, so a race that needs seconds of bad luck in
production is reproduced every time. ``await pause_point(name)`` is a dictionary lookup when no
hook is installed; only tests install hooks (:func:`installed`). The points are listed in
:data:`POINTS` (and in docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from shared.core.errors import ConfigError

__all__ = ["POINTS", "installed", "pause_point"]

POINTS = frozenset(
    {
        "sweeper.after_snapshot",  # stale tiles read, no broker check made yet
        "sweeper.before_claim",  # broker checks made, the re-check-and-claim not yet run
        "gateway.received",  # a request read by the gateway's callback, nothing decided yet
    }
)

Hook = Callable[[], Awaitable[None]]

_hooks: dict[str, Hook] = {}


async def pause_point(name: str) -> None:
    """Run the hook installed at ``name``, if any (and nothing else)."""
    hook = _hooks.get(name)
    if hook is not None:
        await hook()


@contextmanager
def installed(name: str, hook: Hook) -> Iterator[None]:
    """Install ``hook`` at the point ``name`` for the duration of the ``with`` block."""
    if name not in POINTS:
        raise ConfigError(f"pause point {name!r} is unknown; known: {sorted(POINTS)}")
    if name in _hooks:
        raise ConfigError(f"pause point {name!r} already has a hook")
    _hooks[name] = hook
    try:
        yield
    finally:
        del _hooks[name]
