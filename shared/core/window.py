"""The dispatch window rule: pure functions, no I/O (docs/architecture.md, "Scheduler").

A renderer's window is ``base + buffer`` messages released and unfinished (a tile alone is a
message; a run of short tiles is one: :func:`shared.metadata.dispatch.release`). Below, "tile"
means such a message:

- ``base = TESSERA_DISPATCH_FACTOR x threads`` of its live workers: the tiles they hold;
- ``buffer``: tiles waiting in ``TILES`` for the next free slot, so a worker that finishes a
  tile takes the next one from the stream instead of waiting for a dispatch round. The workers
  finish ``base / tile`` tiles a second (``tile``: the mean seconds of a recent done attempt,
  lease to commit, with ``base`` of them in hand); a round answers a tile-done nudge ``gap``
  seconds later (measured: nudge to the round's last publish). The dispatcher runs a round
  after ``refill`` tile-done nudges, ``refill = floor(HEADROOM x gap x base / tile)``, the tiles
  the workers finish in ``HEADROOM`` gaps, and keeps ``buffer = 2 x refill`` in the stream: when
  a round is due, ``refill`` tiles are still waiting, ``HEADROOM`` gaps of work.

Long tiles (``tile`` much longer than ``gap``) get no buffer: a higher-priority job waits for no
more released tiles than the workers hold. Their round is due after ``spare`` tile-done nudges,
the fewest tiles any live worker holds beyond one per kernel thread (``factor x threads -
threads`` with the default in-hand; 1 when a worker holds no more than it renders): however
those tiles fall, each worker still has a tile for every thread when the round is due, and the
next tile-done comes ``tile / base`` later on average, more than ``HEADROOM`` round latencies
(else the tiles would have a buffer). A round per tile-done cost as much coordination as the
commit itself with long tiles (README, "Performance").
Short tiles get a buffer that the workers drain in ``2 x HEADROOM`` gaps, which is all a
higher-priority job can wait for behind it (a few rounds' latency). The buffer is at most
``TESSERA_DISPATCH_MAX_FACTOR x threads - base``; without a measured tile or gap it is 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["HEADROOM", "Ewma", "Window", "refill_after", "window"]

HEADROOM = 2.0
"""Round latencies of work the stream still holds when the next round is due."""


@dataclass
class Ewma:
    """An exponentially weighted moving average; ``value`` is ``None`` before a sample."""

    alpha: float = 0.2
    value: float | None = None

    def add(self, sample: float) -> float:
        """Fold ``sample`` in; the new average."""
        self.value = (
            sample if self.value is None else self.value + self.alpha * (sample - self.value)
        )
        return self.value


@dataclass(frozen=True)
class Window:
    """One renderer's window: ``base`` held by the workers, ``buffer`` waiting in the stream,
    ``refill``, the tile-done nudges after which a round is due (the workers' spare tiles
    without a buffer, half the buffer with one, at least 1), and whether its tiles' duration
    was ``measured``."""

    base: int
    buffer: int
    refill: int
    measured: bool = False

    @property
    def capacity(self) -> int:
        """Released-and-unfinished tiles the renderer may have: ``base + buffer``."""
        return self.base + self.buffer


def window(
    threads: int,
    *,
    factor: float,
    max_factor: float,
    tile_seconds: float | None,
    gap_seconds: float | None,
    spare: int = 0,
) -> Window:
    """The window of a renderer whose live workers run ``threads`` kernel threads (see the
    module docstring); ``tile_seconds``/``gap_seconds`` ``None`` when not measured yet;
    ``spare``: the fewest tiles a live worker holds beyond one per thread
    (:func:`shared.nats.presence.spare`)."""
    base = int(factor * threads)
    room = max(0, int(max_factor * threads) - base)
    if tile_seconds is None or tile_seconds <= 0:
        return Window(base, 0, 1)
    # (the base alone bounds how many tiles the workers hold beyond one per thread)
    spare = max(1, min(spare, base - threads))
    if base <= 0 or gap_seconds is None or gap_seconds <= 0:
        return Window(base, 0, spare, measured=True)
    ahead = HEADROOM * gap_seconds * base / tile_seconds
    buffer = min(2 * math.floor(ahead), room) if math.isfinite(ahead) else room
    return Window(base, buffer, max(spare, buffer // 2), measured=True)


def refill_after(windows: Iterable[Window]) -> int:
    """Tile-done nudges before the next round: the smallest ``refill`` of the renderers whose
    tiles were measured (a nudge does not say whose tile finished; a renderer with no recent
    tile has none to protect), 1 without one."""
    return min((w.refill for w in windows if w.measured), default=1)
