"""Runs of short tiles: how many tiles of a job one ``TILES`` message carries (pure, no I/O).

A tile message costs the same coordination whatever the tile's size: the dispatcher's
confirmed publish and a place in its window, the worker's fetch and ack, the stream's store and
delivery. For a tile of well under a second that is a real part of what the tile costs, so the
dispatcher sends consecutive tiles of a job released in one round as one message, a **run**
(docs/architecture.md, "Runs of short tiles"), which counts once in the dispatch window. Every
tile of a run keeps its own lease, fence, commit and tile-done event; only the message is
shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

__all__ = ["MAX_RUN", "RunTile", "run_length", "runs"]

MAX_RUN = 64
"""Most tiles one ``TILES`` message may carry (the wire contract's bound)."""


def run_length(spp: int, tile_pixels: int, *, most: int, work: int) -> int:
    """Tiles per message for a job of ``spp`` whose tiles have ``tile_pixels`` pixels each.

    As many as cover at most ``work`` pixel-samples together, between 1 and ``most`` (itself
    at most :data:`MAX_RUN`): a job whose tile alone covers more than half of ``work`` sends
    each tile alone.
    """
    if spp <= 0 or tile_pixels <= 0:
        return 1
    return max(1, min(most, MAX_RUN, work // (tile_pixels * spp)))


class RunTile(Protocol):
    """What grouping reads of a tile row."""

    @property
    def job_id(self) -> str: ...

    @property
    def tile_index(self) -> int: ...

    @property
    def generation(self) -> int: ...


T = TypeVar("T", bound=RunTile)


def runs(tiles: Iterable[T], length: Mapping[str, int]) -> list[Sequence[T]]:
    """``tiles`` cut into runs: consecutive indexes of one job under one generation, at most
    ``length[job_id]`` tiles each (1 for a job it does not name), in job and index order."""
    out: list[list[T]] = []
    for t in sorted(tiles, key=lambda t: (t.job_id, t.tile_index)):
        last = out[-1] if out else None
        if (
            last is not None
            and len(last) < length.get(t.job_id, 1)
            and last[-1].job_id == t.job_id
            and last[-1].generation == t.generation
            and last[-1].tile_index + 1 == t.tile_index
        ):
            last.append(t)
        else:
            out.append([t])
    return list(out)
