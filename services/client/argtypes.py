"""argparse ``type=`` converters for numbers that must be positive (errors exit 2, with usage)."""

from __future__ import annotations

import argparse
import math

__all__ = ["non_negative_int", "positive_float", "positive_int"]


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
