"""Scene assets end to end: the client's upload_scene against a real gateway and object store.

Chunk requests are counted by a plain NATS subscription on the ``asset.chunk`` subject beside
the gateway's queue group (core NATS delivers every request to it too): that is what went over
the wire, whatever the client or the gateway believe.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from proto.api import SubmitRequest
from proto.assets import Manifest
from proto.names import ApiVerb, Names
from proto.replies import ApiError
from services.client.api import TesseraClient
from services.client.assets import AssetRefused, collect_files, upload_scene
from services.gateway.app import Gateway
from services.worker.assets import AssetCache
from shared.core.config import Settings
from shared.devstack.stack import S3_ACCESS_KEY, S3_BUCKET, S3_SECRET_KEY, SeaweedS3
from shared.objectstore import ObjectStore, asset_chunk_key, asset_manifest_key
from shared.service.runtime import Runtime
from tests.gateway.conftest import raw_request
from tests.helpers import eventually

MiB = 1024 * 1024
MSGPACK = {"Content-Type": "application/msgpack"}


@dataclass
class Spy:
    """Every asset.chunk request seen on the wire."""

    requests: int = 0
    bytes: int = 0
    #: the chunk digest of each request (a ``busy`` answer's retry sends the same one again)
    digests: list[str] = field(default_factory=list)

    async def record(self, msg: Msg) -> None:
        self.requests += 1
        self.bytes += len(msg.data)
        self.digests.append(str(msgpack.unpackb(msg.data)["sha256"]))


@pytest.fixture
async def spy(nc: NATS, names: Names) -> AsyncIterator[Spy]:
    seen = Spy()
    sub: Subscription = await nc.subscribe(
        names.api_subject(ApiVerb.ASSET_CHUNK),
        cb=seen.record,
        pending_msgs_limit=1000,
        pending_bytes_limit=512 * MiB,
    )
    await nc.flush()
    try:
        yield seen
    finally:
        await sub.unsubscribe()


@pytest.fixture(params=["directory", "s3"])
async def any_gateway(
    request: pytest.FixtureRequest, settings_env: dict[str, str], database_url: str
) -> AsyncIterator[Gateway]:
    """A started gateway on a directory store or on SeaweedFS (S3)."""
    env = dict(settings_env)
    if request.param == "s3":
        seaweed: SeaweedS3 = request.getfixturevalue("seaweed")
        env |= {
            "TESSERA_OBJECT_STORE": f"s3://{S3_BUCKET}",
            "TESSERA_S3_ENDPOINT": seaweed.endpoint,
            "TESSERA_S3_ACCESS_KEY": S3_ACCESS_KEY,
            "TESSERA_S3_SECRET_KEY": S3_SECRET_KEY,
        }
    rt = await Runtime.open(Settings.from_env(env), "gateway")
    gw = Gateway(rt)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(5.0)
        await rt.close()


def random_file(path: Path, size: int, *, block: int = MiB) -> None:
    """``size`` random bytes written a block at a time (never held whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        left = size
        while left:
            f.write(os.urandom(min(block, left)))
            left -= min(block, left)


def pov_scene(root: Path, texture_bytes: int = 9 * MiB) -> Path:
    """scene.pov → parts/wall.inc → tex/wood.png (random bytes), plus files it does not need."""
    main = root / "scene.pov"
    main.parent.mkdir(parents=True, exist_ok=True)
    main.write_text(
        '#include "colors.inc"  // POV-Ray\'s own: not uploaded\n'
        '#include "parts/wall"\n'
        "camera { location <0, 1, -3> look_at 0 }\n"
        '// #include "commented-out.inc"\n'
    )
    (root / "parts").mkdir()
    (root / "parts" / "wall.inc").write_text(
        'plane { z, 2 pigment { image_map { png "tex/wood.png" } } }\n'
    )
    random_file(root / "tex" / "wood.png", texture_bytes)
    (root / "notes.txt").write_text("not part of the scene\n")
    return main


async def stored_manifest(store: ObjectStore, sha: str) -> Manifest:
    raw = await store.get(asset_manifest_key(sha), sha256=sha)
    return Manifest.parse(orjson.loads(raw), max_bytes=2**40)


async def test_upload_stores_the_scene_and_its_dependencies_and_a_second_upload_sends_nothing(
    any_gateway: Gateway, client: TesseraClient, spy: Spy, tmp_path: Path
) -> None:
    main = pov_scene(tmp_path / "shot")
    asset, rel = await upload_scene(client, main, "povray", False)
    assert rel == "scene.pov"
    manifest = await stored_manifest(any_gateway.rt.store, asset)
    assert [f.path for f in manifest.files] == ["parts/wall.inc", "scene.pov", "tex/wood.png"]
    wood = manifest.file("tex/wood.png")
    assert wood is not None and len(wood.chunks) == 3  # 9 MiB in 4 MiB chunks
    data = (tmp_path / "shot" / "tex" / "wood.png").read_bytes()
    assert wood.sha256 == hashlib.sha256(data).hexdigest()
    for i, digest in enumerate(wood.chunks):
        part = data[i * 4 * MiB : (i + 1) * 4 * MiB]
        assert await any_gateway.rt.store.get(asset_chunk_key(digest), sha256=digest) == part
    await eventually(lambda: spy.requests == 5, what="the spy saw the 5 chunks")
    first = (spy.requests, spy.bytes)
    assert first[1] > 9 * MiB

    again, _ = await upload_scene(client, main, "povray", False)
    assert again == asset
    await client.asset_missing([])  # a round trip: anything sent before it has arrived
    assert (spy.requests, spy.bytes) == first, "the second upload sent no chunk"
    assert any_gateway.assets.chunks_stored == 5


async def test_an_interrupted_upload_sends_only_the_missing_chunks_when_run_again(
    gateway: Gateway,
    client: TesseraClient,
    spy: Spy,
    nc: NATS,
    names: Names,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    main = pov_scene(tmp_path / "shot", texture_bytes=40 * MiB)  # 10 chunks of the texture
    task = asyncio.create_task(upload_scene(client, main, "povray", False))
    # Interrupted once the third chunk is answered, counted in the client: the wire spy's own
    # connection may read behind the upload on a loaded machine (it once saw its third request
    # only after all twelve were stored). The other sender's chunk may be on its way: at most 4.
    send = client.asset_chunk
    answered = 0

    async def counting(sha256: str, data: bytes) -> dict[str, Any]:
        nonlocal answered
        reply = await send(sha256, data)
        answered += 1
        if answered == 3:
            task.cancel()
        return reply

    monkeypatch.setattr(client, "asset_chunk", counting)
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.setattr(client, "asset_chunk", send)
    # Every chunk request the cancelled run sent is on the server once its connection is flushed,
    # so a marker sent to the same subject afterwards reaches the gateway's subscription after
    # them (its callbacks run one at a time, in order): the marker's answer means every one of
    # them has been taken, and once the large lane is empty every one has been served.
    await client.nc.flush()
    marker = msgpack.packb({"sha256": "0" * 64, "data": b"marker"})
    answer = await raw_request(nc, names, ApiVerb.ASSET_CHUNK, marker, MSGPACK)
    assert answer["ok"] is False and answer["error"]["code"] in {"invalid", "busy"}, answer
    await eventually(
        lambda: gateway.intake.large.in_use == 0, what="the gateway served what was sent"
    )
    stored = {i.key.rsplit("/", 1)[-1] for i in await gateway.rt.store.list("assets/chunks/")}
    assert 3 <= len(stored) <= 4, stored
    assert not await gateway.rt.store.list("assets/manifests/")
    sent_before = len(spy.digests)

    asset, _ = await upload_scene(client, main, "povray", False)
    await client.asset_missing([])
    manifest = await stored_manifest(gateway.rt.store, asset)
    every = set(manifest.chunks())
    assert len(every) == 12  # scene.pov, wall.inc, 10 texture chunks
    resent = set(spy.digests[sent_before:])
    assert not resent & stored, "a chunk already stored was sent again"
    assert resent | stored == every and len(resent) <= 12 - len(stored), "only the missing ones"


async def test_an_upload_cancelled_while_the_nats_client_drops_cancels_sends_no_more_chunks(
    gateway: Gateway,
    client: TesseraClient,
    spy: Spy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nats-py drops a cancel that lands while a 4 MiB publish is flushed (and its
    # asyncio.wait_for for the reply drops one that lands as the reply is there, on Python
    # 3.11): CI once stored eleven chunks of twelve after an upload was cancelled. Here every
    # cancel that lands inside a request is dropped, and the upload is cancelled once the
    # third chunk is answered.
    main = pov_scene(tmp_path / "shot", texture_bytes=40 * MiB)
    task = asyncio.create_task(upload_scene(client, main, "povray", False))
    request = client.nc.request
    chunk_subject = client.names.api_subject(ApiVerb.ASSET_CHUNK)
    sent = answered = 0

    async def dropping_cancels(subject: str, *args: Any, **kwargs: Any) -> Msg:
        nonlocal sent, answered
        sent += subject == chunk_subject
        inner = asyncio.ensure_future(request(subject, *args, **kwargs))
        while True:
            try:
                reply = await asyncio.shield(inner)  # ends: the request has its own timeout
                break
            except asyncio.CancelledError:
                continue
        answered += subject == chunk_subject
        if answered == 3:
            task.cancel()
        return reply

    monkeypatch.setattr(client.nc, "request", dropping_cancels)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sent <= 4, f"{sent} chunks of 12 were sent: a dropped cancel went unnoticed"
    # (the wire spy's own connection may read behind the client's on a loaded machine)
    await eventually(lambda: spy.requests == sent, what="the wire saw what the client sent",
                     detail=lambda: f"{spy.requests} on the wire, {sent} sent")  # fmt: skip


async def test_a_200_mb_scene_uploads_and_materializes_in_bounded_memory(
    gateway: Gateway, client: TesseraClient, tmp_path: Path
) -> None:
    size = 200 * 1000 * 1000
    root = tmp_path / "big"
    random_file(root / "terrain.png", size, block=4 * MiB)
    main = root / "big.pov"
    main.write_text('height_field { png "terrain.png" }\n')
    tracemalloc.start()
    try:
        asset, _ = await upload_scene(client, main, "povray", False)
        _, upload_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        cache = AssetCache(gateway.rt.store, tmp_path / "cache", 1024 * MiB)
        path = await cache.materialize(asset)
        _, cache_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a few chunks in flight in the client, the gateway and NATS, never the 200 MB
    assert upload_peak < 64 * MiB, upload_peak
    assert cache_peak < 32 * MiB, cache_peak
    assert (path / "terrain.png").stat().st_size == size
    manifest = await stored_manifest(gateway.rt.store, asset)
    assert manifest.size == size + main.stat().st_size and len(manifest.chunks()) == 49


# ------------------------------------------------------------------------ refused at submit


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('#include "../outside.inc"', "not a file inside the scene's directory"),
        ('#include "/etc/povray.inc"', "absolute path"),
        ('#include "C:/scenes/a.inc"', "drive letter"),
        ('#include "dir\\\\a.inc"', "backslash"),
        ('#include "nothere.inc"', "missing dependency"),
        ('sphere { 0, 1 pigment { image_map { png "gone.png" } } }', "missing dependency"),
    ],
)
async def test_the_client_refuses_a_scene_that_cannot_be_an_asset_and_sends_nothing(
    gateway: Gateway, client: TesseraClient, spy: Spy, tmp_path: Path, line: str, problem: str
) -> None:
    (tmp_path / "outside.inc").write_text("// outside the scene's directory\n")
    main = tmp_path / "scene" / "scene.pov"
    main.parent.mkdir()
    main.write_text(f"{line}\n")
    with pytest.raises(AssetRefused, match=problem) as refused:
        await upload_scene(client, main, "povray", False)
    assert refused.value.status == 2
    await client.asset_missing([])
    assert spy.requests == 0
    assert not await gateway.rt.store.list("assets/")


async def test_two_paths_that_differ_only_by_case_are_refused(
    gateway: Gateway, client: TesseraClient, spy: Spy, tmp_path: Path
) -> None:
    (tmp_path / "a.inc").write_text("\n")
    (tmp_path / "A.inc").write_text("\n")
    main = tmp_path / "s.pov"
    main.write_text('#include "a.inc"\n#include "A.inc"\n')
    files = await collect_files(main, "povray")
    assert [f.rel for f in files] == ["s.pov", "a.inc", "A.inc"]
    with pytest.raises(AssetRefused, match="appears and as"):  # they collide on macOS/Windows
        await upload_scene(client, main, "povray", False)
    assert spy.requests == 0


async def test_an_asset_over_the_gateway_s_limit_is_refused_before_uploading(
    gateway: Gateway, client: TesseraClient, spy: Spy, tmp_path: Path
) -> None:
    main = pov_scene(tmp_path / "shot", texture_bytes=1 * MiB)
    gateway.assets.max_asset_bytes = MiB
    with pytest.raises(AssetRefused, match="TESSERA_ASSET_MAX_BYTES"):
        await upload_scene(client, main, "povray", False)
    assert spy.requests == 0


# ------------------------------------------------------------------------ refused at the gateway


async def store_chunk(client: TesseraClient, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    reply = await client.asset_chunk(digest, data)
    assert reply["sha256"] == digest and reply["size"] == len(data)
    return digest


def entry(path: str, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    chunks = [digest] if data else []
    return {"path": path, "size": len(data), "sha256": digest, "chunks": chunks}


@pytest.mark.parametrize(
    ("paths", "problem"),
    [
        (["../escape.pov"], "'..' part"),
        (["a/../../escape.pov"], "'..' part"),
        (["/etc/passwd"], "absolute path"),
        (["~/x.pov"], "absolute path"),
        (["a\\b.pov"], "backslash"),
        (["C:x.pov"], "drive letter"),
        (["a//b.pov"], "empty"),
        (["s.pov", "s.pov"], "appears twice"),
        (["s.pov", "S.POV"], "appears and as"),
        (["s.pov", "s.pov/x"], "a file and a directory"),
    ],
)
async def test_the_gateway_refuses_an_unsafe_manifest(
    any_gateway: Gateway, client: TesseraClient, paths: list[str], problem: str
) -> None:
    data = b"sphere { 0, 1 }\n"
    await store_chunk(client, data)
    before = await any_gateway.rt.store.list("assets/manifests/")  # S3: one bucket for all tests
    manifest = {"main": paths[0], "files": [entry(p, data) for p in paths]}
    reply = await raw_request(
        client.nc,
        client.names,
        ApiVerb.ASSET_MANIFEST,
        orjson.dumps({"manifest": manifest}),
    )
    assert reply["ok"] is False and reply["error"]["code"] == "invalid", reply
    assert problem in reply["error"]["message"]
    assert await any_gateway.rt.store.list("assets/manifests/") == before


async def test_the_gateway_refuses_a_manifest_whose_chunks_are_missing_or_short(
    gateway: Gateway, client: TesseraClient
) -> None:
    data = b"x" * 1000
    absent = entry("s.pov", data)
    reply = await raw_request(
        client.nc, client.names, ApiVerb.ASSET_MANIFEST, orjson.dumps({"manifest": {
            "main": "s.pov", "files": [absent]}})
    )  # fmt: skip
    assert reply["error"]["code"] == "not_found" and "not stored" in reply["error"]["message"]
    await store_chunk(client, data)
    lying = absent | {"size": 1001}  # one chunk, but stored with 1000 bytes
    reply = await raw_request(
        client.nc, client.names, ApiVerb.ASSET_MANIFEST, orjson.dumps({"manifest": {
            "main": "s.pov", "files": [lying]}})
    )  # fmt: skip
    assert (
        reply["error"]["code"] == "invalid" and "its place needs 1001" in reply["error"]["message"]
    )
    assert not await gateway.rt.store.list("assets/manifests/")


async def test_the_gateway_refuses_a_pov_scene_whose_include_is_not_in_the_asset(
    gateway: Gateway, client: TesseraClient
) -> None:
    main = b'#include "colors.inc"\n#include "walls.inc"\n'
    await store_chunk(client, main)
    files = [entry("s.pov", main)]
    manifest = {"main": "s.pov", "files": files}
    with pytest.raises(ApiError, match=r"walls\.inc.*missing dependency") as refused:
        await client.asset_manifest(manifest, "povray")
    assert refused.value.code == "invalid"
    walls = b'plane { y, 0 pigment { image_map { png "floor.png" } } }\n'
    await store_chunk(client, walls)
    files.append(entry("walls.inc", walls))
    with pytest.raises(ApiError, match=r"floor\.png.*missing dependency"):
        await client.asset_manifest(manifest, "povray")
    assert not await gateway.rt.store.list("assets/manifests/")
    await store_chunk(client, b"png")
    files.append(entry("floor.png", b"png"))
    reply = await client.asset_manifest(manifest, "povray")
    assert reply["files"] == 3 and reply["stored"] is True


async def test_the_gateway_refuses_an_asset_over_its_limit(
    gateway: Gateway, client: TesseraClient
) -> None:
    data = b"y" * 5000
    await store_chunk(client, data)
    gateway.assets.max_asset_bytes = 4999
    with pytest.raises(ApiError, match="exceed the limit of 4999 bytes"):
        await client.asset_manifest({"main": "s.pov", "files": [entry("s.pov", data)]})


async def test_a_chunk_is_stored_only_if_it_matches_its_sha256_and_fits(
    any_gateway: Gateway, client: TesseraClient
) -> None:
    nc, names = client.nc, client.names
    wrong = msgpack.packb({"sha256": "0" * 64, "data": b"abc"})
    reply = await raw_request(nc, names, ApiVerb.ASSET_CHUNK, wrong, MSGPACK)
    assert reply["error"]["code"] == "invalid" and "nothing was stored" in reply["error"]["message"]
    too_big = b"z" * (4 * MiB + 1)
    body = msgpack.packb({"sha256": hashlib.sha256(too_big).hexdigest(), "data": too_big})
    reply = await raw_request(nc, names, ApiVerb.ASSET_CHUNK, body, MSGPACK)
    assert reply["error"]["code"] == "invalid" and "data" in reply["error"]["message"]
    as_json = orjson.dumps({"sha256": "0" * 64, "data": "abc"})
    reply = await raw_request(nc, names, ApiVerb.ASSET_CHUNK, as_json)
    assert reply["error"]["code"] == "bad_request" and "msgpack" in reply["error"]["message"]
    store = any_gateway.rt.store
    assert not await store.exists(asset_chunk_key("0" * 64))
    assert not await store.exists(asset_chunk_key(hashlib.sha256(b"abc").hexdigest()))
    assert not await store.exists(asset_chunk_key(hashlib.sha256(too_big).hexdigest()))
    full = os.urandom(4 * MiB)  # the largest chunk: through the large lane, as msgpack
    digest = hashlib.sha256(full).hexdigest()
    assert (await client.asset_chunk(digest, full))["stored"] is True
    assert (await client.asset_chunk(digest, full))["stored"] is False
    assert (await client.asset_missing([digest, "1" * 64]))["missing"] == ["1" * 64]


async def test_a_submit_naming_an_asset_that_is_not_stored_or_not_its_file_is_refused(
    gateway: Gateway, client: TesseraClient, tmp_path: Path
) -> None:
    main = pov_scene(tmp_path / "shot", texture_bytes=1024)
    base: dict[str, Any] = {
        "project": "p",
        "renderer": "povray",
        "width": 32,
        "height": 32,
        "spp": 1,
    }
    missing = SubmitRequest(**base, scene={"asset": "0" * 64, "main": "scene.pov"})
    with pytest.raises(ApiError) as info:
        await client.submit(missing)
    assert info.value.code == "not_found" and "upload it first" in str(info.value)
    asset, rel = await upload_scene(client, main, "povray", False)
    wrong = SubmitRequest(**base, scene={"asset": asset, "main": "notes.txt"})
    with pytest.raises(ApiError) as info:
        await client.submit(wrong)
    assert info.value.code == "invalid" and "not a file of asset" in str(info.value)
    ok = await client.submit(SubmitRequest(**base, scene={"asset": asset, "main": rel}))
    assert ok["created"] is True
    assert len(await gateway.rt.db.list_jobs(limit=10)) == 1, "the refused ones wrote nothing"
