"""``tessera gc``: delete orphaned checkpoints and stale temporary files, never a result.

A checkpoint (``checkpoints/<job>/<tile>/<attempt>-<samples>.npy``) older than the threshold is
garbage if its job no longer exists or is terminal, its tile is done (or otherwise terminal), or
the tile's progress pointer does not name it (a superseded checkpoint, or one whose clean-up
failed). The threshold protects a checkpoint written a moment ago whose pointer is not yet written.
A stale temporary file is a hidden ``.<name>.<random>.tmp`` of the directory store left by a
crash inside ``put`` (S3 puts are atomic and leave none).

What gc deletes is only ever under ``checkpoints/`` or a hidden temporary file:
``tiles/`` (tile results, which finalization reads) and ``renders/`` (published images, named
by ``result_location``/``float_location``) are never candidates, whatever their age; every
deletion is checked against that rule again right before it happens. Directories a deletion
leaves empty are removed with it (a temporary file here, an object by the store itself).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from proto import names as n
from shared.core.errors import ValidationError
from shared.core.lifecycle import JobState, TileState, is_terminal
from shared.metadata import MetadataStore
from shared.nats.leases import ProgressPointers
from shared.objectstore import DirectoryStore, ObjectInfo, ObjectStore
from shared.objectstore.directory import prune_empty_dirs

__all__ = ["Garbage", "collect", "find_garbage", "parse_age"]

CHECKPOINTS = "checkpoints/"
_CHECKPOINT_RE = re.compile(r"checkpoints/([A-Za-z0-9_-]{1,64})/(\d+)/[A-Za-z0-9_-]{1,64}\.npy")
_TEMP_RE = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Garbage:
    """One object gc deletes (or, in a dry run, would delete), and why."""

    key: str
    why: str
    age: float
    size: int
    #: a directory-store temporary file (not an object: deleted by path)
    temp: bool = False


def parse_age(raw: str) -> float:
    """``90``, ``90s``, ``15m``, ``1h``, ``2d`` as seconds."""
    text = raw.strip().lower()
    unit = _UNITS.get(text[-1:], 0)
    number = text[:-1] if unit else text
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        raise ValidationError(f"--older-than {raw!r} is not a duration like 90s, 15m, 1h") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValidationError(f"--older-than {raw!r} must be a finite duration >= 0")
    return value


async def find_garbage(
    store: ObjectStore, db: MetadataStore, progress: ProgressPointers, *, older_than: float
) -> list[Garbage]:
    """Everything gc would delete now (reads only)."""
    now = time.time()
    old = [o for o in await store.list(CHECKPOINTS) if now - o.modified >= older_than]
    parsed = [(o, _CHECKPOINT_RE.fullmatch(o.key)) for o in old]
    ours = [(o, m.group(1), int(m.group(2))) for o, m in parsed if m is not None]
    states = await db.ops.job_tile_states(sorted({job for _, job, _ in ours}))
    pointers: dict[tuple[str, int], str | None] = {}
    found: list[Garbage] = []
    for info, job_id, index in ours:
        why = _why_orphaned(states.get(job_id), index)
        if why is None:
            if (job_id, index) not in pointers:
                got = await progress.get(n.progress_key(job_id, index))
                pointers[job_id, index] = None if got is None else got[0].checkpoint_key
            if pointers[job_id, index] != info.key:
                why = "no progress pointer names it"
        if why is not None:
            found.append(_garbage(info, why, now))
    if isinstance(store, DirectoryStore):
        found += await asyncio.to_thread(_stale_temps, store.root, older_than, now)
    return found


def _why_orphaned(state: tuple[JobState, dict[int, TileState]] | None, index: int) -> str | None:
    if state is None:
        return "its job does not exist"
    job_state, tiles = state
    if is_terminal(job_state):
        return f"its job is {job_state.value}"
    tile_state = tiles.get(index)
    if tile_state is None:
        return "its tile does not exist"
    if is_terminal(tile_state):
        return f"its tile is {tile_state.value}"
    return None


def _garbage(info: ObjectInfo, why: str, now: float) -> Garbage:
    return Garbage(info.key, why, now - info.modified, info.size)


def _stale_temps(root: Path, older_than: float, now: float) -> list[Garbage]:
    found = []
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            if _TEMP_RE.fullmatch(name) is None:
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # renamed into place meanwhile
            if now - st.st_mtime >= older_than:
                rel = path.relative_to(root).as_posix()
                found.append(Garbage(rel, "stale temporary file", now - st.st_mtime,
                                     st.st_size, temp=True))  # fmt: skip
    return found


async def collect(store: ObjectStore, garbage: list[Garbage]) -> int:
    """Delete ``garbage``; the number deleted. Refuses anything outside gc's scope."""
    for item in garbage:
        if item.temp:
            if not isinstance(store, DirectoryStore):
                raise ValidationError(f"{item.key}: temporary files exist only in a directory")
            path = store.root / item.key
            if _TEMP_RE.fullmatch(path.name) is None or not path.resolve().is_relative_to(
                store.root
            ):
                raise ValidationError(f"gc refuses to delete {item.key}: not a temporary file")
            await asyncio.to_thread(_unlink_temp, path, store.root)
        else:
            if _CHECKPOINT_RE.fullmatch(item.key) is None:
                raise ValidationError(f"gc refuses to delete {item.key}: not a checkpoint")
            await store.delete(item.key)
    return len(garbage)


def _unlink_temp(path: Path, root: Path) -> None:
    path.unlink(missing_ok=True)
    prune_empty_dirs(path.parent, root)
