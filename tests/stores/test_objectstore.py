"""One contract suite for every object store, plus what only one implementation can show.

The directory store runs in ``tmp_path``; the S3 store against the session's real SeaweedFS,
each test under its own key prefix.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.core.config import ObjectStoreSettings
from shared.core.errors import NotFoundError, StoreUnavailable, ValidationError
from shared.devstack.procs import free_port
from shared.devstack.stack import S3_ACCESS_KEY, S3_BUCKET, S3_SECRET_KEY, SeaweedS3
from shared.objectstore import (
    CorruptObject,
    DirectoryStore,
    ObjectStore,
    S3Store,
    StoreAccessDenied,
    checkpoint_key,
    open_object_store,
    render_key,
    sha256_hex,
    tile_result_key,
)
from shared.objectstore.directory import READ_CHUNK, TEMP_SUFFIX, _chunk_size, write_temp
from tests.helpers import eventually

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def s3_settings(endpoint: str, *, secret: str = S3_SECRET_KEY) -> ObjectStoreSettings:
    return ObjectStoreSettings(
        kind="s3",
        bucket=S3_BUCKET,
        endpoint=endpoint,
        access_key=S3_ACCESS_KEY,
        secret_key=secret,
    )


@pytest.fixture(params=["directory", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    if request.param == "directory":
        opened = await open_object_store(ObjectStoreSettings(kind="file", path=str(tmp_path)))
    else:
        seaweed: SeaweedS3 = request.getfixturevalue("seaweed")
        opened = await open_object_store(s3_settings(seaweed.endpoint))
    async with opened:
        yield opened


@pytest.fixture
def prefix(namespace: str) -> str:
    return f"test/{namespace}/"


# ------------------------------------------------------------------------------ contract


async def test_a_put_given_the_digest_does_not_hash_again(
    store: ObjectStore, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A content-addressed put passes the digest it built the key from: the store records and
    returns it as is (the bytes were hashed once, by the caller), and reads check against it."""
    data = b"result bytes" * 1000
    digest = hashlib.sha256(data).hexdigest()
    calls: list[int] = []
    module = sys.modules[type(store).__module__]
    real = module.sha256_hex

    def counted(b: bytes) -> str:
        calls.append(len(b))
        return str(real(b))

    monkeypatch.setattr(module, "sha256_hex", counted)
    key = prefix + "tiles/j/0/given.npy"
    assert await store.put(key, data, durable=False, sha256=digest) == digest
    assert calls == [], "the given digest was not used as is"
    assert await store.put(prefix + "tiles/j/0/hashed.npy", data) == digest
    assert calls == [len(data)], "without a digest the store hashes the bytes itself"
    monkeypatch.undo()
    assert await store.get(key, sha256=digest) == data


async def test_round_trip(store: ObjectStore, prefix: str) -> None:
    data = b"tile bytes \x00\xff" * 100
    key = prefix + "a/one.npy"
    digest = await store.put(key, data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert await store.get(key) == data
    assert await store.get(key, sha256=digest) == data
    assert await store.exists(key)


async def test_a_put_not_made_durable_reads_back_and_replaces_whole(
    store: ObjectStore, prefix: str
) -> None:
    key = prefix + "tiles/j/0/result.npy"
    digest = await store.put(key, b"first, longer than the second", durable=False)
    assert digest == hashlib.sha256(b"first, longer than the second").hexdigest()
    await store.put(key, b"second", durable=False)
    assert await store.get(key, sha256=hashlib.sha256(b"second").hexdigest()) == b"second"


async def test_size_and_ranges(store: ObjectStore, prefix: str) -> None:
    data = os.urandom(3000)
    key = prefix + "ranged.png"
    await store.put(key, data)
    assert await store.size(key) == 3000
    assert await store.get_range(key, 0, 1000) == data[:1000]
    assert await store.get_range(key, 1000, 1500) == data[1000:2500]
    assert await store.get_range(key, 2500, 1000) == data[2500:], "fewer bytes at the end"
    assert await store.get_range(key, 3000, 10) == b"", "nothing at the end"
    assert await store.get_range(key, 5000, 10) == b"", "nothing past the end"
    for call in (store.size(prefix + "none.png"), store.get_range(prefix + "none.png", 0, 1)):
        with pytest.raises(NotFoundError):
            await call


async def test_overwrite_replaces_the_whole_object(store: ObjectStore, prefix: str) -> None:
    key = prefix + "over.npy"
    await store.put(key, b"first version, longer than the second")
    await store.put(key, b"second")
    assert await store.get(key) == b"second"
    [info] = await store.list(prefix)
    assert (info.key, info.size) == (key, 6)
    assert abs(info.modified - time.time()) < 60


async def test_missing_object(store: ObjectStore, prefix: str) -> None:
    with pytest.raises(NotFoundError):
        await store.get(prefix + "nothing.npy")
    assert not await store.exists(prefix + "nothing.npy")


async def test_checksum_mismatch_is_a_corrupt_object(store: ObjectStore, prefix: str) -> None:
    key = prefix + "sha.npy"
    await store.put(key, b"actual")
    with pytest.raises(CorruptObject):
        await store.get(key, sha256=sha256_hex(b"expected"))
    with pytest.raises(ValidationError):
        await store.get(key, sha256="not-a-digest")


async def test_get_many_answers_each_object_as_get_does(store: ObjectStore, prefix: str) -> None:
    """Objects read together come back in order, each as :meth:`get` reads it alone: its
    bytes, or the NotFoundError or CorruptObject raised for it (returned, so one missing
    object does not hide the others); more of them than one thread call of the directory
    store reads, and more than ``in_flight``."""
    datas = [bytes([i]) * (100 + i) for i in range(40)]
    keys = [f"{prefix}many/{i}.npy" for i in range(40)]
    await asyncio.gather(*(store.put(k, d) for k, d in zip(keys, datas, strict=True)))
    items: list[tuple[str, str | None]] = [
        (k, sha256_hex(d)) for k, d in zip(keys, datas, strict=True)
    ]
    items[5] = (keys[5], sha256_hex(b"other bytes"))
    items[17] = (prefix + "many/missing.npy", sha256_hex(b"x"))
    items[30] = (keys[30], None)  # nothing to check against
    got = await store.get_many(items, in_flight=3)
    assert len(got) == 40
    assert isinstance(got[5], CorruptObject) and isinstance(got[17], NotFoundError)
    assert [g for i, g in enumerate(got) if i not in (5, 17)] == [
        d for i, d in enumerate(datas) if i not in (5, 17)
    ]
    assert await store.get_many([]) == []
    with pytest.raises(ValidationError):
        await store.get_many([(keys[0], None), ("../up", None)])


async def test_put_many_stores_each_as_put_does(
    store: ObjectStore, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Objects written together read back as each :meth:`put` would have written it (the
    given digest used as is, not hashed again), replacing what was there; a bad key refuses
    the whole call before anything is written."""
    datas = [bytes([i]) * (50 + i) for i in range(20)]
    keys = [f"{prefix}tiles/j/{i}/r.npy" for i in range(20)]
    await store.put(keys[3], b"older object, replaced")
    module = sys.modules[type(store).__module__]
    monkeypatch.setattr(module, "sha256_hex", lambda b: pytest.fail("hashed again"))
    items = [(k, d, hashlib.sha256(d).hexdigest()) for k, d in zip(keys, datas, strict=True)]
    await store.put_many(items, durable=False, in_flight=3)
    await store.put_many([])
    monkeypatch.undo()
    for key, data, digest in items:
        assert await store.get(key, sha256=digest) == data
    with pytest.raises(ValidationError):
        await store.put_many([(prefix + "ok.npy", b"x", sha256_hex(b"x")), ("../up", b"y", "0")])
    assert not await store.exists(prefix + "ok.npy"), "written before the bad key was seen"
    for bad in (0, -1):  # (a semaphore of 0 would wait forever)
        with pytest.raises(ValueError, match="in_flight"):
            await store.put_many(items, in_flight=bad)
        with pytest.raises(ValueError, match="in_flight"):
            await store.get_many([(keys[0], None)], in_flight=bad)


async def test_the_directory_store_writes_many_objects_in_one_thread_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's tile results: one hop to a thread for all of them, not one per object; an
    ``OSError`` fails the call as it fails a :meth:`put`."""
    store = await DirectoryStore.open(tmp_path / "objects")
    calls: list[str] = []
    real = asyncio.to_thread

    async def counted(func: object, /, *args: object, **kwargs: object) -> object:
        calls.append(getattr(func, "__name__", "?"))
        return await real(func, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(asyncio, "to_thread", counted)
    items = [(f"tiles/j/{i}/r.npy", bytes([i]) * 10, sha256_hex(bytes([i]) * 10)) for i in range(8)]
    await store.put_many(items, durable=False)
    assert calls == ["_put_files"]
    (tmp_path / "objects" / "blocked").write_bytes(b"a file where a directory must go")
    with pytest.raises(StoreUnavailable):
        await store.put_many([("blocked/r.npy", b"x", sha256_hex(b"x"))])


@pytest.mark.parametrize(
    ("cores", "count", "size"),
    [(2, 9, 5), (2, 64, 32), (2, 1, 4), (8, 40, 5), (1, 9, 9), (64, 64, 4), (1, 200, READ_CHUNK)],
)
def test_a_short_read_of_the_directory_store_is_split_over_the_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, count: int, size: int
) -> None:
    """Objects per thread call: a finalization's results go to every core this process may run
    on, one call per core, in calls of at least 4 objects (fewer only when fewer are read) and
    at most READ_CHUNK."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert _chunk_size(count) == size


async def test_delete_is_idempotent(store: ObjectStore, prefix: str) -> None:
    key = prefix + "gone.npy"
    await store.put(key, b"x")
    await store.delete(key)
    await store.delete(key)
    await store.delete(prefix + "never-existed.npy")
    assert not await store.exists(key)
    assert await store.list(prefix) == []


async def _dirs_under(store: ObjectStore, prefix: str) -> list[str]:
    """Directories a directory store holds under ``prefix`` (S3 has none: always empty)."""
    if not isinstance(store, DirectoryStore):
        return []
    top = store.root / prefix.split("/")[0]
    found = await asyncio.to_thread(lambda: [p for p in top.rglob("*") if p.is_dir()])
    return sorted(p.relative_to(store.root).as_posix() for p in found) + (
        [top.name] if top.is_dir() else []
    )


async def test_deleting_the_last_key_under_a_prefix_leaves_nothing_behind(
    store: ObjectStore, prefix: str
) -> None:
    keys = [prefix + "checkpoints/j/0/a-4.npy", prefix + "checkpoints/j/0/a-8.npy",
            prefix + "checkpoints/j/1/b-4.npy"]  # fmt: skip
    for key in keys:
        await store.put(key, b"x")
    await store.delete(keys[0])
    assert [i.key for i in await store.list(prefix)] == keys[1:]
    await store.delete(keys[1])
    if isinstance(store, DirectoryStore):  # tile 0's directory went with its last object
        assert not store.path_of(keys[1]).parent.exists()
        assert store.path_of(keys[2]).parent.is_dir(), "tile 1 still has an object"
    await store.delete(keys[2])
    assert await store.list(prefix) == []
    assert await _dirs_under(store, prefix) == []
    assert store.root.is_dir() if isinstance(store, DirectoryStore) else True
    await store.put(keys[0], b"again")  # and the prefix is usable again
    assert await store.get(keys[0]) == b"again"


async def test_puts_and_deletes_racing_in_one_directory_all_succeed(
    store: ObjectStore, prefix: str
) -> None:
    # Fresh directories, each churned by 24 keys at once: where the directory store prunes and
    # re-makes directories, two races showed up (a kept directory removed before its fsync, one
    # removed inside mkdir's exist_ok check). S3 has no directories: a few rounds suffice.
    rounds = 30 if isinstance(store, DirectoryStore) else 3

    async def churn(key: str) -> None:
        for _ in range(5):
            await store.put(key, key.encode())
            await store.delete(key)

    for r in range(rounds):
        await asyncio.gather(*(churn(f"{prefix}race/{r}/{i}.npy") for i in range(24)))
    assert await store.list(prefix) == []
    assert await _dirs_under(store, prefix) == []


async def test_list_by_prefix(store: ObjectStore, prefix: str) -> None:
    keys = ["a/1.npy", "a/2.npy", "ab/3.npy", "b/4.npy", "a/deeper/5.npy"]
    await asyncio.gather(*(store.put(prefix + k, k.encode()) for k in keys))
    listed = [i.key for i in await store.list(prefix + "a/")]
    assert listed == [prefix + k for k in ("a/1.npy", "a/2.npy", "a/deeper/5.npy")]
    assert [i.key for i in await store.list(prefix + "a")] == [
        prefix + k for k in ("a/1.npy", "a/2.npy", "a/deeper/5.npy", "ab/3.npy")
    ]
    assert len(await store.list(prefix)) == 5
    assert len(await store.list(prefix, limit=2)) == 2
    assert await store.list(prefix + "zzz/") == []


async def test_large_object(store: ObjectStore, prefix: str) -> None:
    data = os.urandom(8 * MiB)
    key = prefix + "big.npy"
    digest = await store.put(key, data)
    assert await store.get(key, sha256=digest) == data


async def test_concurrent_puts_leave_one_whole_object(store: ObjectStore, prefix: str) -> None:
    key = prefix + "race.npy"
    payloads = [bytes([i]) * (MiB + i) for i in range(16)]
    digests = await asyncio.gather(*(store.put(key, p) for p in payloads))
    final = await store.get(key)
    assert sha256_hex(final) in digests
    assert final == bytes([final[0]]) * (MiB + final[0])
    assert [i.key for i in await store.list(prefix)] == [key]


async def test_ping(store: ObjectStore) -> None:
    await store.ping()


@pytest.mark.parametrize("bad", ["", "/abs", "../up", "a/../b", "a//b", ".hidden", "a/.tmp", "a b"])
async def test_bad_keys_are_refused(store: ObjectStore, bad: str) -> None:
    with pytest.raises(ValidationError):
        await store.put(bad, b"x")
    with pytest.raises(ValidationError):
        await store.get(bad)


# ---------------------------------------------------------------------------- key builders


def test_key_builders() -> None:
    sha = "0f" * 32
    job = "0190d5c4-7d2b-7c39-9c1e-8d7a2f5b1e11"
    assert checkpoint_key(job, 3, "att-1", 40) == f"checkpoints/{job}/3/att-1-40.npy"
    assert tile_result_key(job, 0, sha) == f"tiles/{job}/0/{sha}.npy"
    assert render_key(job, sha, "png") == f"renders/{job}/{sha}.png"
    assert render_key(job, sha, ".npy") == f"renders/{job}/{sha}.npy"
    for call in (
        lambda: checkpoint_key("../x", 0, "a", 1),
        lambda: checkpoint_key(job, -1, "a", 1),
        lambda: checkpoint_key(job, 0, "a/b", 1),
        lambda: checkpoint_key(job, 0, "a", -1),
        lambda: tile_result_key(job, 0, "F" * 64),
        lambda: tile_result_key(job, True, sha),
        lambda: render_key(job, sha, "exe"),
        lambda: render_key("job id", sha, "png"),
    ):
        with pytest.raises(ValidationError):
            call()


# ----------------------------------------------------------------------- directory only


async def test_directory_unreplaced_temp_is_invisible(tmp_path: Path) -> None:
    store = await DirectoryStore.open(tmp_path)
    key = "checkpoints/j/0/a.npy"
    # A crash after writing the temp file, before the rename:
    store.path_of(key).parent.mkdir(parents=True)
    temp = await asyncio.to_thread(write_temp, store.path_of(key), b"half")
    assert temp.exists() and temp.name.endswith(TEMP_SUFFIX)
    assert not await store.exists(key)
    with pytest.raises(NotFoundError):
        await store.get(key)
    assert await store.list("") == []


async def test_directory_paths_are_never_resolved(tmp_path: Path) -> None:
    """Keys are checked lexically, never resolved: no key names a path outside the root, and a
    symlink inside the store is gone through by reads, writes and deletes (the link stays)."""
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir()
    store = await DirectoryStore.open(tmp_path / "store")
    link = store.root / "renders"
    link.symlink_to(elsewhere, target_is_directory=True)
    digest = await store.put("renders/j/a.png", b"image")
    assert (elsewhere / "j" / "a.png").read_bytes() == b"image"
    assert await store.get("renders/j/a.png", sha256=digest) == b"image"
    assert [o.key for o in await store.list("renders/")] == ["renders/j/a.png"]
    await store.delete("renders/j/a.png")
    assert not await store.exists("renders/j/a.png")
    assert link.is_symlink() and not (elsewhere / "j").exists()
    for bad in ("renders/../../x", "../other-disk/j/a.png", "/abs"):
        with pytest.raises(ValidationError):
            store.path_of(bad)


async def test_directory_put_leaves_no_temp_files(tmp_path: Path) -> None:
    store = await DirectoryStore.open(tmp_path)
    await asyncio.gather(*(store.put(f"t/{i % 3}.npy", os.urandom(1000)) for i in range(30)))
    await store.ping()
    names = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.rglob("*")))
    assert names == ["0.npy", "1.npy", "2.npy", "t"]


async def test_directory_fsyncs_the_file_and_its_directory_unless_not_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = list[int]()
    real = os.fsync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    store = await DirectoryStore.open(tmp_path)
    await store.put("renders/j/image.png", b"png")
    assert len(synced) == 2, "the file, then the directory holding its new name"
    await store.put("tiles/j/0/result.npy", b"npy", durable=False)
    assert len(synced) == 2, "no fsync for an object made again if lost"
    assert await store.get("tiles/j/0/result.npy") == b"npy"


@pytest.mark.parametrize("durable", [True, False])
async def test_directory_kill_mid_write_never_leaves_a_partial_file(
    tmp_path: Path, durable: bool
) -> None:
    size = 4 * MiB
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from shared.objectstore import DirectoryStore

        async def main():
            store = await DirectoryStore.open(Path({str(tmp_path)!r}))
            i = 0
            while True:
                await store.put("renders/j/x.npy", bytes([i % 251]) * {size}, durable={durable})
                i += 1
                print(i, flush=True)

        asyncio.run(main())
        """
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        for _ in range(3):  # a few complete writes, then SIGKILL during one of the next
            assert await proc.stdout.readline()
        await asyncio.sleep(0.013)
    finally:
        proc.kill()
        await proc.wait()
    store = await DirectoryStore.open(tmp_path)
    data = await store.get("renders/j/x.npy")
    assert len(data) == size and data == bytes([data[0]]) * size
    assert [i.key for i in await store.list("")] == ["renders/j/x.npy"]


async def test_directory_os_errors_are_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = await DirectoryStore.open(root)
    root.rmdir()
    root.write_bytes(b"the volume went away and a file is here now")
    with pytest.raises(StoreUnavailable):
        await store.ping()
    with pytest.raises(StoreUnavailable):
        await store.put("a/b.npy", b"x")
    with pytest.raises(StoreUnavailable):
        await DirectoryStore.open(root / "below-a-file")


# ------------------------------------------------------------------------------ S3 only


async def test_s3_recorded_checksum_catches_a_substituted_object(
    seaweed: SeaweedS3, prefix: str
) -> None:
    async with await S3Store.open(s3_settings(seaweed.endpoint)) as store:
        assert isinstance(store, S3Store)
        key = prefix + "swapped.npy"
        await store._client.put_object(  # a writer that bypasses the store
            Bucket=S3_BUCKET, Key=key, Body=b"other", Metadata={"sha256": sha256_hex(b"mine")}
        )
        with pytest.raises(CorruptObject):
            await store.get(key)


async def test_s3_presigned_url_serves_the_object_without_credentials(
    seaweed: SeaweedS3, prefix: str
) -> None:
    data = os.urandom(5000)
    async with await S3Store.open(s3_settings(seaweed.endpoint)) as store:
        key = prefix + "signed.png"
        await store.put(key, data)
        url = await store.presign_get(key, 60)
    assert url is not None and url.startswith(seaweed.endpoint)
    body = await asyncio.to_thread(_http_get, url)  # a plain HTTP GET, no S3 client
    assert body == data
    with pytest.raises(urllib.error.HTTPError) as refused:  # the signature covers the key
        await asyncio.to_thread(_http_get, url.replace("signed.png", "other.png"))
    refused.value.close()
    assert refused.value.code == 403


async def test_s3_presigned_url_expires(seaweed: SeaweedS3, prefix: str) -> None:
    async with await S3Store.open(s3_settings(seaweed.endpoint)) as store:
        key = prefix + "brief.png"
        await store.put(key, b"short-lived")
        url = await store.presign_get(key, 1)
    assert url is not None and await asyncio.to_thread(_http_get, url) == b"short-lived"

    async def refused() -> bool:
        try:
            await asyncio.to_thread(_http_get, url)
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code == 403
        return False

    await eventually(refused, timeout=15, what="the 1 s URL is refused once it expired")


def _http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        data: bytes = response.read()
    return data


async def test_directory_store_cannot_presign(tmp_path: Path) -> None:
    store = await DirectoryStore.open(tmp_path)
    await store.put("a/b.png", b"x")
    assert await store.presign_get("a/b.png", 60) is None


async def test_s3_unreachable_endpoint_is_unavailable_quickly() -> None:
    started = time.monotonic()
    async with await S3Store.open(s3_settings(f"http://127.0.0.1:{free_port()}")) as store:
        with pytest.raises(StoreUnavailable):
            await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.put("x/y.npy", b"data")
    assert time.monotonic() - started < 6


async def test_s3_wrong_credentials_are_terminal(seaweed: SeaweedS3, prefix: str) -> None:
    async with await S3Store.open(s3_settings(seaweed.endpoint, secret="wrong")) as store:
        with pytest.raises(StoreAccessDenied, match="TESSERA_S3"):
            await store.ping()
        with pytest.raises(StoreAccessDenied):
            await store.put(prefix + "x.npy", b"data")
        with pytest.raises(StoreAccessDenied):
            await store.get(prefix + "x.npy")


@pytest.mark.chaos
async def test_s3_outage_then_recovery(tmp_path: Path) -> None:
    server = SeaweedS3(tmp_path / "seaweed")
    # weed's default 10 s raft election timeout dominates a restart; one node needs no patience.
    server.proc.argv.append("-master.electionTimeout=1s")
    await asyncio.to_thread(server.start)
    try:
        async with await S3Store.open(s3_settings(server.endpoint)) as store:
            before = await store.put("outage/before.npy", b"kept")
            await asyncio.to_thread(server.stop)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.put("outage/during.npy", b"lost")
            assert time.monotonic() - started < 6
            await asyncio.to_thread(server.start)  # same ports, same data directory

            async def writable() -> bool:
                try:
                    await store.put("outage/after.npy", b"works")
                except StoreUnavailable:
                    return False  # volumes may still be registering with the master
                return True

            await eventually(writable, timeout=15, what="S3 writable after restart")
            assert await store.get("outage/before.npy", sha256=before) == b"kept"
            assert await store.get("outage/after.npy") == b"works"
    finally:
        await asyncio.to_thread(server.stop)
