"""A committed tile's result bytes, checked: what the finalizer assembles and the preview shows.

A done tile's row names its result's sha256 and either an object key (``result_key``) or an
inline row in ``tile_results``; the bytes count only if they hash to that sha256. One reader for
both users, so the preview never shows a result the finalizer would refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from shared.core.errors import NotFoundError
from shared.objectstore import CorruptObject, ObjectStore, sha256_hex

__all__ = [
    "CommittedTile",
    "ResultMissing",
    "committed_result",
    "committed_results",
    "inline_result",
]


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


async def committed_results(
    store: ObjectStore,
    tiles: Sequence[CommittedTile],
    inline: dict[int, tuple[str, bytes]],
    *,
    in_flight: int = 16,
) -> list[bytes | ResultMissing]:
    """:func:`committed_result` of each of ``tiles``, in order, its :class:`ResultMissing`
    returned rather than raised; the objects read together, ``in_flight`` at a time
    (:meth:`ObjectStore.get_many`)."""
    objects = [t for t in tiles if t.result_key and t.result_sha256]
    wanted = [(t.result_key or "", t.result_sha256) for t in objects]
    read = await store.get_many(wanted, in_flight=in_flight)
    by_index = dict(zip((t.tile_index for t in objects), read, strict=True))
    out: list[bytes | ResultMissing] = []
    for t in tiles:
        got = by_index.get(t.tile_index)
        if isinstance(got, bytes):
            out.append(got)
        elif got is not None:
            out.append(ResultMissing(f"{t.result_key}: {got}"))
        else:
            try:
                out.append(inline_result(t, inline))
            except ResultMissing as exc:
                out.append(exc)
    return out


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
