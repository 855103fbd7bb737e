"""The finalizer's early read: the results are read while it checks, leases and moves the job,
and assembly uses only what still matches the rows it reads afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

import kernel.image
from services.finalizer.assemble import Finalizer
from services.finalizer.cache import Result
from shared.core.errors import NotFoundError, StoreUnavailable
from shared.core.tiles import load_npy, plan_rects, to_npy
from shared.metadata import TileResultRef
from shared.objectstore import DirectoryStore, sha256_hex, tile_result_key
from shared.objectstore.base import CorruptObject
from shared.service.logs import Log
from shared.service.metrics import Metrics

JOB = "01a24f4f-5fed-7547-88d7-d5a898dbdf40"
W, H, TILE, SPP = 24, 16, 8, 4
JOB_ROW = SimpleNamespace(job_id=JOB, width=W, height=H, spp=SPP, renderer="tessera")


class Store(DirectoryStore):
    """A directory store that records each ``get_many`` call's keys (and fails if told to)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: list[list[str]] = []
        self.fail = False

    async def get_many(
        self, items: Sequence[tuple[str, str | None]], *, in_flight: int = 16
    ) -> list[bytes | NotFoundError | CorruptObject]:
        self.calls.append([k for k, _ in items])
        if self.fail:
            raise StoreUnavailable("store away")
        return await super().get_many(items, in_flight=in_flight)


class Rows:
    """The tiles table as the finalizer reads it (its refs can change between two reads)."""

    def __init__(self, refs: list[TileResultRef]) -> None:
        self.refs = refs

    async def result_refs(self, job_id: str) -> list[TileResultRef]:
        assert job_id == JOB
        return list(self.refs)

    async def tile_results(self, job_id: str) -> dict[int, tuple[str, bytes]]:
        return {}


async def _stored(store: DirectoryStore, seed: int) -> tuple[list[TileResultRef], np.ndarray]:
    """A frame's tile results stored: the refs naming them, and the frame's accumulator."""
    frame = np.random.default_rng(seed).random((H, W, 3)) * SPP
    refs = []
    for i, rect in enumerate(plan_rects(W, H, TILE)):
        x0, y0, x1, y1 = rect
        data = to_npy(frame[y0:y1, x0:x1])
        key = tile_result_key(JOB, i, sha256_hex(data))
        await store.put(key, data, durable=False)
        refs.append(TileResultRef(i, rect, key, sha256_hex(data)))
    return refs, frame


def _finalizer(store: DirectoryStore, rows: Rows) -> Finalizer:
    settings = SimpleNamespace(finalizer=SimpleNamespace(read_ahead_bytes=1 << 20))
    rt = SimpleNamespace(store=store, db=rows, settings=settings, log=Log("test"),
                         metrics=Metrics())  # fmt: skip
    return Finalizer(cast(Any, rt))


def _done(value: dict[int, tuple[str, str, bytes]]) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _is_frame(got: tuple[np.ndarray, np.ndarray], frame: np.ndarray) -> bool:
    mean, image = kernel.image.display_images(frame, SPP)
    return bool(np.array_equal(got[0], mean) and np.array_equal(got[1], image))


async def test_results_read_early_are_assembled_without_reading_them_again(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path)
    refs, frame = await _stored(store, 1)
    finalizer = _finalizer(store, Rows(refs))
    early = asyncio.create_task(finalizer._read_early(JOB))
    assert _is_frame(await finalizer._assemble(cast(Any, JOB_ROW), early), frame)
    assert store.calls == [[r.result_key for r in refs]], "one read: the early one"


async def test_a_result_whose_row_changed_after_the_early_read_is_read_as_the_row_names(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path)
    refs, frame = await _stored(store, 1)
    rows = Rows(refs)
    finalizer = _finalizer(store, rows)
    early = await finalizer._read_early(JOB)
    assert set(early) == {r.tile_index for r in refs}
    # then tile 2's result was lost and rendered again with other bytes: its row moved on
    other, other_frame = await _stored(store, 2)
    rows.refs[2] = other[2]
    x0, y0, x1, y1 = other[2].rect
    frame[y0:y1, x0:x1] = other_frame[y0:y1, x0:x1]
    got = await finalizer._assemble(cast(Any, JOB_ROW), _done(early))
    assert _is_frame(got, frame), "tile 2 as its row names now, the others as read early"
    assert store.calls[-1] == [other[2].result_key]


@pytest.mark.parametrize("how", ["the store fails", "the read-ahead holds one"])
async def test_what_the_early_read_misses_or_skips_is_read_at_assembly(
    tmp_path: Path, how: str
) -> None:
    store = Store(tmp_path)
    refs, frame = await _stored(store, 3)
    finalizer = _finalizer(store, Rows(refs))
    if how == "the store fails":
        store.fail = True
        early = await finalizer._read_early(JOB)
        assert early == {}, "a failed early read is only a miss"
        store.fail = False
    else:
        first = refs[0]
        data = await store.get(first.result_key or "")
        held = Result(first.result_key or "", first.result_sha256 or "", load_npy(data), None)
        finalizer.read_ahead.put(JOB, 0, held)
        early = await finalizer._read_early(JOB)
        assert set(early) == {r.tile_index for r in refs[1:]}, "what is held is not read again"
    got = await finalizer._assemble(cast(Any, JOB_ROW), _done(early))
    assert _is_frame(got, frame)
    if how == "the store fails":
        assert store.calls[-1] == [r.result_key for r in refs]
    else:
        assert len(store.calls) == 1
