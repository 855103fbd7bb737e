"""A committed tile's result bytes, checked: what the finalizer assembles and the preview shows.

A done tile's row names its result's sha256 and either an object key (``result_key``) or an
inline row in ``tile_results``; the bytes count only if they hash to that sha256. One reader for
both users, so the preview never shows a result the finalizer would refuse.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from shared.core.errors import NotFoundError
from shared.objectstore import CorruptObject, ObjectStore, sha256_hex

__all__ = ["CommittedTile", "ResultMissing", "committed_result", "inline_result"]


class ResultMissing(Exception):
    """One tile's committed result cannot be read intact (the message says why)."""


class CommittedTile(Protocol):
    """What names a tile's result: a :class:`~shared.metadata.Tile` or a
    :class:`~shared.metadata.TileResultRef`."""

    @property
    def tile_index(self) -> int: ...
    @property
    def result_key(self) -> str | None: ...
    @property
    def result_sha256(self) -> str | None: ...


async def committed_result(
    store: ObjectStore,
    tile: CommittedTile,
    inline: dict[int, tuple[str, bytes]],
    gate: asyncio.Semaphore,
) -> bytes:
    """The tile's committed result bytes, checked against its sha256, or :class:`ResultMissing`.

    ``inline`` holds the job's inline results (``tile_index -> (sha256, data)``); ``gate``
    bounds the object-store reads in flight.
    """
    if tile.result_key and tile.result_sha256:
        try:
            async with gate:
                return await store.get(tile.result_key, sha256=tile.result_sha256)
        except (CorruptObject, NotFoundError) as exc:
            raise ResultMissing(f"{tile.result_key}: {exc}") from exc
    return inline_result(tile, inline)


def inline_result(tile: CommittedTile, inline: dict[int, tuple[str, bytes]]) -> bytes:
    """:func:`committed_result` of a tile whose result is inline (no object key): no await,
    for a reader of thousands of small tiles."""
    if not tile.result_sha256:
        raise ResultMissing("done but records no result sha256")
    if tile.tile_index not in inline:
        raise ResultMissing("done but names no result")
    sha, data = inline[tile.tile_index]
    if sha != tile.result_sha256 or sha256_hex(data) != tile.result_sha256:
        raise ResultMissing(
            f"its inline result does not match the recorded sha256 {tile.result_sha256}"
        )
    return data
