"""argparse ``type=`` converters for numbers that must be positive (errors exit 2, with usage)."""

from __future__ import annotations

import argparse
import math
import re
from datetime import UTC, datetime, timedelta

from proto.limits import MAX_TILE_SIZE, MIN_TILE_SIZE, TILE_AUTO, TileSize

__all__ = [
    "deadline",
    "max_in_flight",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "priority",
    "tile_size",
    "weight",
]


def positive_float(raw: str) -> float:
    """A finite number > 0 (seconds: intervals, timeouts, windows)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{raw!r}: must be a finite number > 0")
    return value


def positive_int(raw: str) -> int:
    """A whole number >= 1 (counts)."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: must be at least 1")
    return value


def non_negative_int(raw: str) -> int:
    """A whole number >= 0 (counts where 0 switches something off)."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r}: must be at least 0")
    return value


_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def deadline(raw: str, *, now: datetime | None = None) -> str:
    """``--deadline``: ``2h``/``90m``/``30s``/``1d`` from now, or an absolute ISO 8601 time
    (with a UTC offset, or ``Z``); the wire form, an absolute UTC time. Past: refused."""
    now = now or datetime.now(UTC)
    text = raw.strip()
    if match := _RELATIVE.fullmatch(text):
        seconds = float(match[1]) * _UNIT[match[2]]
        if seconds <= 0:
            raise argparse.ArgumentTypeError(f"{raw!r}: a deadline must be in the future")
        return (now + timedelta(seconds=seconds)).isoformat()
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is neither a duration (30s, 90m, 2h, 1d) nor an ISO 8601 time"
        ) from None
    if at.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{raw!r}: give a UTC offset (Z or +HH:MM)")
    at = at.astimezone(UTC)
    if at <= now:
        raise argparse.ArgumentTypeError(f"{raw!r}: that time has passed")
    return at.isoformat()


def priority(raw: str) -> int:
    """A priority, 0..100."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{raw!r}: a priority is between 0 and 100")
    return value


def tile_size(raw: str) -> TileSize:
    """``auto`` (the scheduler picks the edge) or a tile edge in pixels, 8..1024."""
    if raw.strip().lower() == TILE_AUTO:
        return TILE_AUTO
    value = positive_int(raw)
    if not MIN_TILE_SIZE <= value <= MAX_TILE_SIZE:
        raise argparse.ArgumentTypeError(
            f"{raw!r}: a tile edge is {MIN_TILE_SIZE}..{MAX_TILE_SIZE} pixels (or auto)"
        )
    return value


def weight(raw: str) -> float:
    """A fair-share weight: a finite number > 0."""
    return positive_float(raw)


def max_in_flight(raw: str) -> int | None:
    """A cap on in-flight tiles, >= 1, or ``none`` (no cap)."""
    if raw.strip().lower() == "none":
        return None
    return positive_int(raw)
