"""The worker's AssetCache against real object stores (a directory and SeaweedFS S3)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from proto.assets import AssetFile, Manifest, chunk_count
from proto.limits import ASSET_CHUNK_BYTES
from services.worker.assets import MARKER_SUFFIX, AssetCache, AssetTooLarge
from shared.core.config import ObjectStoreSettings
from shared.core.errors import ValidationError
from shared.devstack.stack import SeaweedS3
from shared.objectstore import (
    CorruptObject,
    ObjectStore,
    asset_chunk_key,
    asset_manifest_key,
    open_object_store,
    sha256_hex,
)
from tests.stores.test_objectstore import s3_settings

MiB = 1024 * 1024


@pytest.fixture(params=["directory", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    if request.param == "directory":
        settings = ObjectStoreSettings(kind="file", path=str(tmp_path / "objects"))
        opened = await open_object_store(settings)
    else:
        seaweed: SeaweedS3 = request.getfixturevalue("seaweed")
        opened = await open_object_store(s3_settings(seaweed.endpoint))
    async with opened:
        yield opened


async def put_asset(store: ObjectStore, files: dict[str, bytes], main: str | None = None) -> str:
    """Store ``files`` as an asset (chunks and manifest) the way the gateway does; its sha256."""
    entries = []
    for path, data in files.items():
        chunks = []
        for i in range(chunk_count(len(data))):
            part = data[i * ASSET_CHUNK_BYTES : (i + 1) * ASSET_CHUNK_BYTES]
            chunks.append(await store.put(asset_chunk_key(sha256_hex(part)), part))
        entries.append(AssetFile(path, len(data), sha256_hex(data), tuple(chunks)))
    manifest = Manifest.build(main or next(iter(files)), entries, max_bytes=2**40)
    body = manifest.canonical()
    return await store.put(asset_manifest_key(sha256_hex(body)), body)


def cache_of(store: ObjectStore, root: Path, max_bytes: int = 64 * MiB) -> AssetCache:
    return AssetCache(store, root, max_bytes)


async def test_materialize_writes_every_file_at_its_path_verified_and_read_only(
    store: ObjectStore, tmp_path: Path
) -> None:
    texture = os.urandom(9 * MiB)
    files = {"scene.pov": b'#include "parts/a.inc"\n', "parts/a.inc": b"//\n", "t.png": texture}
    asset = await put_asset(store, files)
    cache = cache_of(store, tmp_path / "cache")
    path = await cache.materialize(asset)
    assert path == tmp_path / "cache" / asset
    for rel, data in files.items():
        assert (path / rel).read_bytes() == data
        assert (path / rel).stat().st_mode & 0o222 == 0
    assert (tmp_path / "cache" / f"{asset}{MARKER_SUFFIX}").is_file()
    assert await cache.materialize(asset) == path and cache.downloads == 1


async def test_concurrent_calls_share_one_download(store: ObjectStore, tmp_path: Path) -> None:
    asset = await put_asset(store, {"a.pov": os.urandom(3 * MiB), "b.png": os.urandom(MiB)})
    cache = cache_of(store, tmp_path / "cache")
    paths = await asyncio.gather(*(cache.materialize(asset) for _ in range(5)))
    assert set(paths) == {tmp_path / "cache" / asset}
    assert cache.downloads == 1


async def test_a_corrupted_cached_file_is_detected_and_fetched_again(
    store: ObjectStore, tmp_path: Path
) -> None:
    data = os.urandom(2 * MiB)
    asset = await put_asset(store, {"s.pov": b"//\n", "t.png": data})
    cache = cache_of(store, tmp_path / "cache")
    path = await cache.materialize(asset)
    target = path / "t.png"
    before = target.stat()
    target.chmod(0o644)
    with target.open("r+b") as f:  # one byte flipped, the mtime put back: ctime still moves
        f.seek(1000)
        f.write(bytes([data[1000] ^ 0xFF]))
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert await cache.materialize(asset) == path
    assert cache.downloads == 2
    assert target.read_bytes() == data


async def test_a_fresh_cache_rehashes_what_it_finds_on_disk(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A change no stat shows (a bit flipped on the disk: here the marker is made to agree
    with the damaged file) is caught by the rehash of the first hit after a restart."""
    data = os.urandom(MiB)
    asset = await put_asset(store, {"s.pov": b"//\n", "t.png": data})
    root = tmp_path / "cache"
    path = await cache_of(store, root).materialize(asset)
    target = path / "t.png"
    target.chmod(0o644)
    target.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # (b"\0" was no change 1 in 256)
    marker = root / f"{asset}{MARKER_SUFFIX}"
    doc = orjson.loads(marker.read_bytes())
    for item in doc["files"]:
        st = (path / item["path"]).stat()
        item |= {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
    marker.write_bytes(orjson.dumps(doc))
    restarted = cache_of(store, root)
    assert await restarted.materialize(asset) == path
    assert restarted.downloads == 1 and target.read_bytes() == data


async def test_a_corrupt_chunk_in_the_store_leaves_nothing_that_looks_complete(
    store: ObjectStore, tmp_path: Path
) -> None:
    good = os.urandom(5 * MiB)
    asset = await put_asset(store, {"s.pov": b"//\n", "t.png": good})
    second = sha256_hex(good[ASSET_CHUNK_BYTES:])
    await store.put(asset_chunk_key(second), b"not the chunk")
    root = tmp_path / "cache"
    cache = cache_of(store, root)
    with pytest.raises(CorruptObject):
        await cache.materialize(asset)
    assert sorted(p.name for p in root.iterdir()) == []  # no asset, no marker, no temp dir
    await store.put(asset_chunk_key(second), good[ASSET_CHUNK_BYTES:])  # repaired: works
    assert (await cache.materialize(asset) / "t.png").read_bytes() == good


async def test_leftovers_of_a_crash_are_removed_at_open(store: ObjectStore, tmp_path: Path) -> None:
    asset = await put_asset(store, {"s.pov": b"sphere {0, 1}\n"})
    root = tmp_path / "cache"
    (root / f".tmp-{asset}-1234").mkdir(parents=True)
    (root / f".tmp-{asset}-1234" / "s.pov").write_bytes(b"half")
    (root / asset).mkdir()  # renamed into place, marker never written
    (root / asset / "s.pov").write_bytes(b"sphere {0, 1}\n")
    cache = cache_of(store, root)
    await cache.open()
    assert cache.cached() == set() and sorted(p.name for p in root.iterdir()) == []
    path = await cache.materialize(asset)
    assert (path / "s.pov").read_bytes() == b"sphere {0, 1}\n" and cache.downloads == 1


async def test_the_bound_evicts_least_recently_used_assets_not_in_use(
    store: ObjectStore, tmp_path: Path
) -> None:
    a, b, c, d = [await put_asset(store, {f"{n}.pov": os.urandom(MiB)}) for n in "abcd"]
    cache = cache_of(store, tmp_path / "cache", max_bytes=2 * MiB + 100)
    await cache.materialize(a)
    await cache.materialize(b)
    await cache.materialize(a)  # a used again: b is now the least recent
    await cache.materialize(c)
    assert cache.cached() == {a, c} and not (tmp_path / "cache" / b).exists()
    async with cache.hold(a) as held:  # a is older than c, but in use
        await cache.materialize(d)
        assert cache.cached() == {a, d} and (held / "a.pov").is_file()
    assert cache.used_bytes <= 2 * MiB + 100
    restarted = cache_of(store, tmp_path / "cache", max_bytes=2 * MiB + 100)
    await restarted.open()
    assert restarted.cached() == {a, d}


async def test_an_asset_larger_than_the_whole_cache_is_refused(
    store: ObjectStore, tmp_path: Path
) -> None:
    asset = await put_asset(store, {"big.pov": os.urandom(MiB)})
    with pytest.raises(AssetTooLarge, match="TESSERA_ASSET_CACHE_BYTES"):
        await cache_of(store, tmp_path / "cache", max_bytes=MiB - 1).materialize(asset)


async def test_a_manifest_with_an_unsafe_path_is_refused_even_past_the_gateway(
    store: ObjectStore, tmp_path: Path
) -> None:
    data = b"//\n"
    digest = await store.put(asset_chunk_key(sha256_hex(data)), data)
    entry = {"path": "../../escape.pov", "size": 3, "sha256": digest, "chunks": [digest]}
    body = orjson.dumps({"files": [entry], "main": "../../escape.pov"})
    asset = await store.put(asset_manifest_key(hashlib.sha256(body).hexdigest()), body)
    with pytest.raises(ValidationError, match=r"'\.\.' part"):
        await cache_of(store, tmp_path / "cache" / "x").materialize(asset)
    assert not (tmp_path / "escape.pov").exists()
    assert list((tmp_path / "cache" / "x").iterdir()) == []


async def test_concurrent_downloads_count_against_the_bound_before_they_land(
    store: ObjectStore, tmp_path: Path
) -> None:
    a, b, c = [await put_asset(store, {f"{n}.pov": os.urandom(MiB)}) for n in "abc"]
    cache = cache_of(store, tmp_path / "cache", max_bytes=2 * MiB + 100)
    await cache.materialize(a)
    await asyncio.gather(cache.materialize(b), cache.materialize(c))
    assert cache.cached() == {b, c} and cache.used_bytes <= 2 * MiB + 100
