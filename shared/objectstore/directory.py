"""The directory object store: one file per object under a root directory.

``put`` writes a hidden temporary file in the object's own directory, fsyncs it, renames it over
the final name (``os.replace`` is atomic on POSIX) and fsyncs the directory, so a crash at any
point leaves the old object or the new one, never a partial final file. ``put(durable=False)``
skips both fsyncs: a process crash still leaves the old object or the new one (the page cache
outlives the process), but an operating-system crash may leave the new one missing or empty
— for objects whose loss is detected by their sha256 and made again (tile results). A crash
can leave a hidden ``.<name>.<random>.tmp`` behind; reads and listings ignore those (keys never
start with a dot). ``delete`` removes the directories the key leaves empty, up to the root, so
a store's directories are exactly the prefixes of its objects (as in S3, which has no
directories).
Blocking file I/O runs in a thread, off the event loop.

``OSError`` (ENOSPC, EIO, EROFS, ...) becomes :class:`StoreUnavailable`; a missing file
:class:`NotFoundError`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from shared.core.errors import NotFoundError, StoreUnavailable, ValidationError
from shared.objectstore.base import (
    CorruptObject,
    ObjectInfo,
    ObjectStore,
    check_in_flight,
    check_key,
    check_prefix,
    gather_all,
    settled,
    sha256_hex,
    verify,
)

TEMP_SUFFIX = ".tmp"
_Read = list[bytes | NotFoundError | CorruptObject]
READ_CHUNK = 64
"""Objects :meth:`DirectoryStore.get_many` reads in one thread call, at most."""
READ_CHUNK_LEAST = 4
"""... and at least, unless fewer are read (a hop to a thread per object costs more)."""


def _chunk_size(count: int) -> int:
    """Objects per thread call for a read of ``count``: between :data:`READ_CHUNK_LEAST` and
    :data:`READ_CHUNK`, one call per core this process may run on (the nine 740 KB results of
    a ``--tile auto`` frame: two calls on two cores, where one call read and hashed all nine
    alone). Not more calls than cores: (a)'s 64 results of 98 KB in four calls of 16 on two
    cores took 9.5–11.4 ms, in two of 32 7.3–8.3 ms (the threads' reads and hashes hand the
    GIL back and forth)."""
    cores = len(os.sched_getaffinity(0)) or 1
    return min(READ_CHUNK, max(READ_CHUNK_LEAST, -(-count // cores)))


class DirectoryStore(ObjectStore):
    """Objects as files under ``root`` (created if missing)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    @classmethod
    async def open(cls, root: Path) -> DirectoryStore:
        """Create ``root`` if needed and return a store on it."""
        store = cls(root)
        with _os_errors(f"directory store {root}"):
            await asyncio.to_thread(store.root.mkdir, parents=True, exist_ok=True)
        return store

    def path_of(self, key: str) -> Path:
        """The final file of ``key``; refuses anything that would leave the root.

        The check is lexical (:func:`check_key`: relative, no empty part, no part starting with
        a dot, so no ``..``): the path is never resolved. Resolving it took seven ``lstat``
        calls on the event loop for every tile result written and read (issue 19; side by
        side, worker 2.45 → 2.27 core-ms per (a) tile). Only a symlink inside the store could
        lead out of the root, and whoever can create one can write the store's files anyway.
        Such a link is not refused (reads, writes and deletes go through it, and a delete
        leaves the link), but :meth:`list` does not descend into one below its prefix.
        """
        return self.root / check_key(key)

    async def put(
        self, key: str, data: bytes, *, durable: bool = True, sha256: str | None = None
    ) -> str:
        path = self.path_of(key)
        digest = sha256 if sha256 is not None else sha256_hex(data)
        with _os_errors(f"put {key}"):
            await asyncio.to_thread(_put_file, path, bytes(data), durable)
        return digest

    async def put_many(
        self, items: Sequence[tuple[str, bytes, str]], *, durable: bool = True, in_flight: int = 16
    ) -> None:
        """:meth:`ObjectStore.put_many` in one thread call, the files written one after the
        other: a hop to a thread and back per object cost the event loop more than writing a
        tile's result to the page cache (the results of a run of tiles, issue 19). An
        ``OSError`` fails the call: the objects written before it stay written, the rest are
        not written."""
        check_in_flight(in_flight)
        files = [(self.path_of(key), bytes(data)) for key, data, _ in items]
        if not files:
            return
        with _os_errors(f"put {items[0][0]} and {len(items) - 1} more"):
            await asyncio.to_thread(_put_files, files, durable)

    async def get(self, key: str, *, sha256: str | None = None) -> bytes:
        path = self.path_of(key)
        with _os_errors(f"get {key}"):
            data = await asyncio.to_thread(_read_file, path)
        if data is None:
            raise NotFoundError(f"object {key} does not exist")
        return verify(key, data, sha256)

    async def get_many(
        self, items: Sequence[tuple[str, str | None]], *, in_flight: int = 16
    ) -> builtins.list[bytes | NotFoundError | CorruptObject]:
        """:meth:`ObjectStore.get_many` in chunks of at most :data:`READ_CHUNK` objects, each
        read and checked in one thread call (``in_flight`` of them at a time): a hop to a thread
        and back per object cost more than reading a tile's result from the page cache (the 64
        reads of a finalization: 26–28 ms, now 14). A short list is still split over the cores
        (:func:`_chunk_size`). An ``OSError`` fails the whole call, as it fails a :meth:`get`."""
        for key, _ in items:
            self.path_of(key)  # (a bad key refuses the call before any read starts)
        size = _chunk_size(len(items))
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        check_in_flight(in_flight)
        gate = asyncio.Semaphore(in_flight)

        async def chunk(part: Sequence[tuple[str, str | None]]) -> _Read:
            async with gate:
                with _os_errors(f"get {part[0][0]} and {len(part) - 1} more"):
                    return await asyncio.to_thread(self._read_checked, part)

        read = settled(await gather_all(*(chunk(part) for part in chunks)))
        return [got for part in read for got in part]

    def _read_checked(self, part: Sequence[tuple[str, str | None]]) -> _Read:
        """Each ``(key, sha256)``'s bytes, checked as :meth:`get` does (in a thread)."""
        out: _Read = []
        for key, sha256 in part:
            data = _read_file(self.path_of(key))
            if data is None:
                out.append(NotFoundError(f"object {key} does not exist"))
                continue
            try:
                out.append(verify(key, data, sha256))
            except CorruptObject as exc:
                out.append(exc)
        return out

    async def size(self, key: str) -> int:
        path = self.path_of(key)
        with _os_errors(f"size {key}"):
            size = await asyncio.to_thread(_file_size, path)
        if size is None:
            raise NotFoundError(f"object {key} does not exist")
        return size

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        path = self.path_of(key)
        if offset < 0 or length < 0:
            raise ValidationError(f"range {offset}+{length} of {key}: negative")
        with _os_errors(f"get {key} [{offset}+{length}]"):
            data = await asyncio.to_thread(_read_range, path, offset, length)
        if data is None:
            raise NotFoundError(f"object {key} does not exist")
        return data

    async def exists(self, key: str) -> bool:
        path = self.path_of(key)
        with _os_errors(f"exists {key}"):
            return await asyncio.to_thread(path.is_file)

    async def delete(self, key: str) -> None:
        path = self.path_of(key)
        with _os_errors(f"delete {key}"):
            await asyncio.to_thread(_delete_file, path, self.root)

    async def list(self, prefix: str, *, limit: int | None = None) -> builtins.list[ObjectInfo]:
        check_prefix(prefix)
        with _os_errors(f"list {prefix!r}"):
            found = await asyncio.to_thread(_list_files, self.root, prefix)
        found.sort(key=lambda info: info.key)
        return found if limit is None else found[:limit]

    async def ping(self) -> None:
        probe = self.root / f".ping.{uuid.uuid4().hex}{TEMP_SUFFIX}"
        with _os_errors(f"ping {self.root}"):
            await asyncio.to_thread(_put_file, probe, b"ping")
            await asyncio.to_thread(probe.unlink)

    async def close(self) -> None:
        return None


@contextlib.contextmanager
def _os_errors(what: str) -> Iterator[None]:
    """Translate ``OSError`` to :class:`StoreUnavailable` (each operation maps a missing object).

    Keys from the builders never collide with directories (leaves end in ``.npy``/``.png``), so
    ENOTDIR/EISDIR mean a broken root, like ENOSPC or EIO: an operations problem.
    """
    try:
        yield
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, "?")
        raise StoreUnavailable(f"{what}: {name}: {exc.strerror or exc}") from exc


def write_temp(path: Path, data: bytes, *, mode: int = 0o644, durable: bool = True) -> Path:
    """Write ``data`` to a fresh hidden file next to ``path`` and fsync it (unless not
    ``durable``); return its path.

    ``path``'s directory must exist. The file gets ``mode`` less the process umask.
    """
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    os.close(fd)
    return temp


def commit_temp(temp: Path, path: Path, *, durable: bool = True) -> None:
    """Atomically rename ``temp`` over ``path`` and make the rename durable (if ``durable``)."""
    try:
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    if durable:
        _fsync_dir(path.parent)


#: tries of a put whose directory a concurrent delete removed between mkdir and the write
_PUT_TRIES = 8


def _put_file(path: Path, data: bytes, durable: bool = True) -> None:
    for _ in range(_PUT_TRIES - 1):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = write_temp(path, data, durable=durable)
        except (FileNotFoundError, FileExistsError):
            # A delete pruned the (then empty) directory: make it again. (FileExistsError: mkdir
            # saw it exist, then it was pruned before mkdir's own is_dir() check.)
            continue
        commit_temp(temp, path, durable=durable)  # (a directory holding our temp is not pruned)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    commit_temp(write_temp(path, data, durable=durable), path, durable=durable)


def _put_files(files: Sequence[tuple[Path, bytes]], durable: bool) -> None:
    for path, data in files:
        _put_file(path, data, durable)


def _read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None  # a directory or a path through a file is not an object either


def _file_size(path: Path) -> int | None:
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size if path.is_file() else None


def _read_range(path: Path, offset: int, length: int) -> bytes | None:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(length)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _delete_file(path: Path, root: Path) -> None:
    try:
        path.unlink()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return
    kept = prune_empty_dirs(path.parent, root)
    # A concurrent delete may empty and remove ``kept`` after our rmdir found it in use: our
    # unlink went with it, and that delete makes the parent's change durable.
    with contextlib.suppress(FileNotFoundError):
        _fsync_dir(kept)


def prune_empty_dirs(directory: Path, root: Path) -> Path:
    """Remove ``directory`` and its parents below ``root`` while they are empty; returns the
    first directory kept (whose entry list changed, for the caller to fsync).

    A key's directories exist only for its objects: without this, every checkpoint, result or
    render deleted would leave ``checkpoints/<job>/<tile>/`` behind. ``rmdir`` refuses a
    directory that is not empty, so a concurrent put (its temporary file already inside) keeps
    it; a put that finds its directory gone makes it again.
    """
    while directory != root and directory.is_relative_to(root):
        try:
            directory.rmdir()
        except FileNotFoundError:
            pass  # a concurrent delete pruned it first: go on with the parent
        except OSError:  # ENOTEMPTY / EEXIST (or anything else): keep it and stop
            return directory
        directory = directory.parent
    return directory


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _list_files(root: Path, prefix: str) -> builtins.list[ObjectInfo]:
    start = root / prefix.rpartition("/")[0]
    found: builtins.list[ObjectInfo] = []
    for directory, dirs, files in os.walk(start):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(directory).relative_to(root)
        for name in files:
            key = name if rel == Path(".") else f"{rel.as_posix()}/{name}"
            if name.startswith(".") or not key.startswith(prefix):
                continue
            try:
                st = os.stat(Path(directory) / name)
            except FileNotFoundError:
                continue  # deleted while we looked
            found.append(ObjectInfo(key=key, size=st.st_size, modified=st.st_mtime))
    return found
