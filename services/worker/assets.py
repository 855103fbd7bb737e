"""The worker's scene asset cache: assets on local disk by manifest sha256, bounded, verified.

A renderer (Blender, POV-Ray) reads a scene from files, so a job's asset (:mod:`proto.assets`)
is materialized as a directory: ``<root>/<manifest sha256>/`` holds its files at their relative
paths, read-only. Layout of ``root`` (one per worker process: the default is per node)::

    <sha256>/            an asset, complete and verified
    <sha256>.verified    its marker: JSON of every file's size, sha256 and stat identity
    .tmp-<sha256>-<rnd>/ an asset being downloaded (never looks complete)
    .trash-<rnd>/        an asset being removed

**Atomic.** An asset is downloaded into a ``.tmp-`` directory, each chunk checked against its
sha256 as it arrives and each file against its sha256 when written (a mismatch is
:class:`~shared.objectstore.CorruptObject`: retryable, nothing kept); the files are fsynced, the
directory renamed into place, and only then the marker written (atomically: temporary file,
fsync, rename). An asset counts only with its marker, so a crash at any point leaves something
that is re-fetched, never a half asset that looks complete; :meth:`AssetCache.open` removes
leftovers.

**Verified on read.** A cache hit is checked against its marker before it is handed out:

- the first hit of an asset in a worker process rehashes every file (sha256): that catches what
  happened while no worker watched (a disk error, an edit, a crash in the middle of an older
  layout) at the cost of reading the asset once per process start;
- every later hit compares each file's size, mtime, ctime and inode with the marker (a ``stat``
  per file, microseconds). Any write to a file, even one that restores the mtime with ``utime``,
  changes its ctime, and replacing it changes the inode; only a change below the file system (a
  bit flip on the disk) escapes this, and the rehash at the next process start catches that.
  Rehashing every hit would read a 200 MB scene for every tile.

A file that fails either check makes the whole asset be removed and fetched again.

**Bounded.** The cache keeps at most ``max_bytes`` of assets (``TESSERA_ASSET_CACHE_BYTES``):
before a download it removes whole assets, least recently used first, that are not in use. An
asset is in use while a :meth:`AssetCache.hold` block runs for it (and while it downloads): use
``async with cache.hold(sha) as path`` around everything that reads the files. Assets in use may
take the cache over its bound; an asset larger than the whole bound is refused
(:class:`AssetTooLarge`, retryable: another worker may have room).

Concurrent calls for the same asset share one download.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proto.assets import AssetFile, Manifest
from shared.core.config import Settings
from shared.core.errors import DecodeError, RetryableError, ValidationError
from shared.objectstore import (
    CorruptObject,
    ObjectStore,
    asset_chunk_key,
    asset_manifest_key,
)
from shared.objectstore.base import check_sha256
from shared.objectstore.directory import commit_temp, write_temp
from shared.service.logs import Log

__all__ = ["MARKER_SUFFIX", "AssetCache", "AssetTooLarge", "default_cache_dir"]

MARKER_SUFFIX = ".verified"
_TMP = ".tmp-"
_TRASH = ".trash-"
_NO_LIMIT = 2**62


class AssetTooLarge(RetryableError):
    """The asset is larger than this worker's whole cache bound (another worker may have room)."""

    code = "asset_too_large"


def default_cache_dir(node: str) -> Path:
    """``~/.cache/tessera/assets/<node>``: one directory per worker process."""
    return Path.home() / ".cache" / "tessera" / "assets" / node


@dataclass
class _Entry:
    size: int
    #: order of last use (higher: more recent); across restarts, the order of marker mtimes
    last_used: int


class AssetCache:
    """Assets of one worker on local disk (see the module docstring)."""

    def __init__(
        self, store: ObjectStore, root: Path, max_bytes: int, *, log: Log | None = None
    ) -> None:
        self.store, self.root, self.max_bytes = store, root, max_bytes
        self.log = log
        self._entries: dict[str, _Entry] = {}
        self._held: Counter[str] = Counter()
        self._downloads: dict[str, asyncio.Task[Path]] = {}
        #: assets rehashed since this cache was opened (later hits only stat their files)
        self._rehashed: set[str] = set()
        self._lock = asyncio.Lock()
        self._opened = False
        self._opening: asyncio.Future[None] | None = None
        self._uses = 0
        #: bytes of downloads in progress, counted against the bound before they land
        self._reserved = 0
        #: downloads made (tests: a hit or a shared download adds none)
        self.downloads = 0

    @classmethod
    def of(cls, store: ObjectStore, settings: Settings, *, log: Log | None = None) -> AssetCache:
        """The cache the worker settings describe (``TESSERA_ASSET_CACHE_DIR``/``_BYTES``)."""
        worker = settings.worker
        root = Path(worker.asset_cache_dir) if worker.asset_cache_dir else None
        return cls(
            store, root or default_cache_dir(settings.node), worker.asset_cache_bytes, log=log
        )

    @property
    def used_bytes(self) -> int:
        """Bytes of the complete assets on disk."""
        return sum(e.size for e in self._entries.values())

    def cached(self) -> set[str]:
        """The assets on disk, complete and marked."""
        return set(self._entries)

    async def open(self) -> None:
        """Create the root, remove leftovers of a crash, index the complete assets (once: a
        scan while a download runs would remove its temporary directory)."""
        if self._opening is None or (self._opening.done() and self._opening.exception()):
            self._opening = asyncio.ensure_future(self._scan())
        await asyncio.shield(self._opening)

    async def _scan(self) -> None:
        self._entries = await asyncio.to_thread(_scan, self.root)
        self._uses = len(self._entries)
        self._opened = True

    async def close(self) -> None:
        """Cancel downloads in progress (their temporary directories are removed)."""
        tasks = list(self._downloads.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def hold(self, manifest_sha256: str) -> AsyncIterator[Path]:
        """The asset's directory, kept (never evicted) until the block ends."""
        self._held[manifest_sha256] += 1
        try:
            yield await self.materialize(manifest_sha256)
        finally:
            self._held[manifest_sha256] -= 1
            if self._held[manifest_sha256] <= 0:
                del self._held[manifest_sha256]

    async def materialize(self, manifest_sha256: str) -> Path:
        """The directory holding the asset's files, downloading and verifying as needed.

        The path stays valid until the asset is evicted; hold it with :meth:`hold` while its
        files are read. Raises :class:`CorruptObject` if the store's bytes do not match their
        digests, :class:`~shared.core.errors.NotFoundError` for an unknown asset.
        """
        sha = check_sha256(manifest_sha256, "asset")
        if not self._opened:
            await self.open()
        task = self._downloads.get(sha)
        if task is None:
            task = asyncio.create_task(self._get(sha))
            self._downloads[sha] = task
            task.add_done_callback(lambda _: self._downloads.pop(sha, None))
        return await asyncio.shield(task)

    async def _get(self, sha: str) -> Path:
        self._held[sha] += 1  # not evicted while it is checked or fetched
        try:
            final = self.root / sha
            if sha in self._entries:
                if await self._verify(sha):
                    self._touch(sha)
                    return final
                await self._remove(sha)
            return await self._download(sha)
        finally:
            self._held[sha] -= 1
            if self._held[sha] <= 0:
                del self._held[sha]

    async def _verify(self, sha: str) -> bool:
        full = sha not in self._rehashed
        problem = await asyncio.to_thread(_check_marker, self.root, sha, full)
        if problem is None:
            self._rehashed.add(sha)
            return True
        if self.log is not None:
            self.log.warning("cached asset failed verification", asset=sha, problem=problem)
        return False

    async def _download(self, sha: str) -> Path:
        raw = await self.store.get(asset_manifest_key(sha), sha256=sha)
        try:  # checked again: a manifest written past the gateway must not escape the cache
            manifest = Manifest.parse(orjson.loads(raw), max_bytes=_NO_LIMIT)
        except (orjson.JSONDecodeError, DecodeError, ValidationError) as exc:
            raise ValidationError(f"asset {sha}: its manifest is refused: {exc}") from exc
        await self._make_room(sha, manifest.size)  # reserves manifest.size
        temp = self.root / f"{_TMP}{sha}-{uuid.uuid4().hex[:8]}"
        try:
            await asyncio.to_thread(temp.mkdir, parents=True)
            for entry in manifest.files:
                await self._fetch_file(temp, entry)
            await asyncio.to_thread(_install, self.root, sha, temp, manifest)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, temp, True)
            raise
        finally:
            self._reserved -= manifest.size
        self._entries[sha] = _Entry(manifest.size, self._use())
        self._rehashed.add(sha)
        self.downloads += 1
        if self.log is not None:
            self.log.info("asset cached", asset=sha, files=len(manifest.files), size=manifest.size)
        return self.root / sha

    async def _fetch_file(self, temp: Path, entry: AssetFile) -> None:
        """One file, chunk by chunk (each verified), then its own sha256 checked."""
        path = temp / entry.path
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        whole = hashlib.sha256()
        f = await asyncio.to_thread(path.open, "wb")
        try:
            for digest in entry.chunks:
                data = await self.store.get(asset_chunk_key(digest), sha256=digest)
                await asyncio.to_thread(_write, f, whole, data)
            await asyncio.to_thread(os.fsync, f.fileno())
        finally:
            await asyncio.to_thread(f.close)
        if whole.hexdigest() != entry.sha256:
            raise CorruptObject(
                f"asset file {entry.path!r}: its chunks give sha256 {whole.hexdigest()}, the "
                f"manifest says {entry.sha256}"
            )
        await asyncio.to_thread(path.chmod, 0o444)

    async def _make_room(self, sha: str, size: int) -> None:
        if size > self.max_bytes:
            raise AssetTooLarge(
                f"asset {sha} has {size} bytes, more than this worker's whole asset cache "
                f"(TESSERA_ASSET_CACHE_BYTES={self.max_bytes})"
            )
        async with self._lock:
            by_age = sorted(self._entries.items(), key=lambda item: item[1].last_used)
            for old, _ in by_age:
                if self.used_bytes + self._reserved + size <= self.max_bytes:
                    break
                if old in self._held or old in self._downloads:
                    continue
                await self._remove(old)
                if self.log is not None:
                    self.log.info("asset evicted", asset=old)
            self._reserved += size

    async def _remove(self, sha: str) -> None:
        self._entries.pop(sha, None)
        self._rehashed.discard(sha)
        await asyncio.to_thread(_delete, self.root, sha)

    def _use(self) -> int:
        self._uses += 1
        return self._uses

    def _touch(self, sha: str) -> None:
        entry = self._entries.get(sha)
        if entry is not None:
            entry.last_used = self._use()
        with contextlib.suppress(OSError):
            os.utime(self.root / f"{sha}{MARKER_SUFFIX}")


def _write(f: Any, whole: Any, data: bytes) -> None:
    whole.update(data)
    f.write(data)


def _stat_identity(path: Path) -> dict[str, int]:
    st = path.stat()
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
    }


def _install(root: Path, sha: str, temp: Path, manifest: Manifest) -> None:
    """Rename the verified ``temp`` into place, then write the marker (atomically)."""
    final = root / sha
    if final.exists():  # a leftover without marker (removed markers first): make way
        _trash(root, final)
    _fsync_dir(temp)
    os.rename(temp, final)
    _fsync_dir(root)
    files = [
        {"path": f.path, "sha256": f.sha256, **_stat_identity(final / f.path)}
        for f in manifest.files
    ]
    marker = root / f"{sha}{MARKER_SUFFIX}"
    body = orjson.dumps({"asset": sha, "size": manifest.size, "files": files})
    commit_temp(write_temp(marker, body), marker)


def _check_marker(root: Path, sha: str, full: bool) -> str | None:
    """None if the asset matches its marker; else what does not."""
    try:
        marker = orjson.loads((root / f"{sha}{MARKER_SUFFIX}").read_bytes())
        files = marker["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"marker unreadable: {exc}"
    for item in files:
        path = root / sha / item["path"]
        try:
            identity = _stat_identity(path)
        except OSError as exc:
            return f"{item['path']}: {exc.strerror or exc}"
        if full:
            if identity["size"] != item["size"] or _file_sha256(path) != item["sha256"]:
                return f"{item['path']}: content differs from its sha256"
        elif any(identity[k] != item[k] for k in identity):
            return f"{item['path']}: changed on disk (size, mtime, ctime or inode)"
    return None


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _delete(root: Path, sha: str) -> None:
    """Marker first (the asset stops counting), then the directory, out of the way first."""
    with contextlib.suppress(FileNotFoundError):
        (root / f"{sha}{MARKER_SUFFIX}").unlink()
    final = root / sha
    if final.exists():
        _trash(root, final)


def _trash(root: Path, directory: Path) -> None:
    trash = root / f"{_TRASH}{uuid.uuid4().hex[:8]}"
    os.rename(directory, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan(root: Path) -> dict[str, _Entry]:
    """Remove leftovers (temporary, trash, unmarked directories, orphan markers); index the
    rest by their markers (size; last use in the order of the markers' mtimes)."""
    root.mkdir(parents=True, exist_ok=True)
    found: list[tuple[float, str, int]] = []
    for item in root.iterdir():
        name = item.name
        if name.startswith((_TMP, _TRASH)):
            shutil.rmtree(item, ignore_errors=True)
            continue
        if name.endswith(MARKER_SUFFIX):
            sha = name.removesuffix(MARKER_SUFFIX)
            if not (root / sha).is_dir():
                item.unlink(missing_ok=True)
                continue
            try:
                size = int(orjson.loads(item.read_bytes())["size"])
            except (OSError, ValueError, KeyError, TypeError):
                _delete(root, sha)
                continue
            found.append((item.stat().st_mtime, sha, size))
    entries = {sha: _Entry(size, i) for i, (_, sha, size) in enumerate(sorted(found))}
    for item in root.iterdir():
        if item.is_dir() and not item.name.startswith(".") and item.name not in entries:
            _trash(root, item)  # renamed before its marker was written: incomplete
    return entries
