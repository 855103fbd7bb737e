"""The asset verbs: asset.missing, asset.chunk, asset.manifest (see :mod:`proto.assets`).

A scene asset reaches the object store in chunks of at most 4 MiB, one request each, never as
one message: ``asset.missing`` says which chunks the store lacks, ``asset.chunk`` stores one
after checking its sha256, ``asset.manifest`` stores the manifest once every chunk it names is
stored with the size its place in its file implies. Everything is content-addressed, so a
repeated or concurrent upload writes the same bytes under the same keys, and a re-run after an
interruption sends only what is missing.

``asset.chunk`` and ``asset.manifest`` bodies are large: they arrive on the gateway's service
connection (like submits) and take the large lane's places, which bound the chunk bytes a
gateway holds to ``TESSERA_GATEWAY_LARGE_IN_FLIGHT`` times twice a chunk (the request and its
decoded ``data``). A chunk is hashed on a thread (hashlib releases the GIL), a large manifest
checked in the large lane's worker process, so the event loop keeps reading.

What the gateway cannot check is left to the worker, which verifies every byte it reads: the
sha256 of each *file* (the gateway checks each chunk's size, not the file's digest, which would
mean reading the whole asset back), except for the POV-Ray files it scans.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

from proto.api import (
    AssetChunkRequest,
    AssetManifestRequest,
    AssetMissingRequest,
    decode_request,
)
from proto.api_replies import AssetChunkReply, AssetManifestReply, AssetMissingReply
from proto.assets import MAX_SCAN_BYTES, Manifest, chunk_sizes, pov_dependencies
from proto.limits import ASSET_CHUNK_BYTES, MAX_MISSING_QUERY
from proto.povray import check_povray_source
from services.gateway.intake import Intake
from shared.core.errors import NotFoundError, ValidationError
from shared.objectstore import (
    ObjectStore,
    asset_chunk_key,
    asset_manifest_key,
    sha256_hex,
)
from shared.service.logs import Log

__all__ = ["AssetHandlers", "parse_manifest_request"]

Headers = Mapping[str, str] | None
_PARALLEL = 16
REFERENCE_CACHE = 256
"""Assets whose file list the gateway keeps for the submits that name them."""
"""Store requests one manifest check makes at once (HEADs of its chunks)."""
_SHOWN = 5


def parse_manifest_request(
    data: bytes, headers: Headers, max_bytes: int
) -> tuple[Manifest, str | None]:
    """Decode and check an ``asset.manifest`` body (pure CPU: a worker process runs it for a
    large body)."""
    request = decode_request(data, headers, AssetManifestRequest)
    return Manifest.parse(request.manifest, max_bytes=max_bytes), request.renderer


class AssetHandlers:
    """The asset verbs over one object store."""

    def __init__(
        self, store: ObjectStore, log: Log, *, max_asset_bytes: int, intake: Intake | None = None
    ) -> None:
        self.store, self.log, self.max_asset_bytes = store, log, max_asset_bytes
        self.intake = intake or Intake()
        #: chunks written by this gateway (tests and metrics: a deduplicated upload adds none)
        self.chunks_stored = 0
        #: manifest sha256 -> its file paths, for the submits that name it (manifests are
        #: content-addressed, so an entry never goes stale while the asset is kept)
        self._paths: OrderedDict[str, frozenset[str]] = OrderedDict()

    async def check_reference(self, scene: Mapping[str, Any]) -> None:
        """A submit's scene reference names a stored asset and one of its files: else
        ``not_found`` (upload it first: ``tessera submit`` does) or ``invalid``, at submit
        rather than as a worker's failure later."""
        sha, main = str(scene["asset"]), str(scene["main"])
        paths = self._paths.get(sha)
        if paths is None:
            try:
                raw = await self.store.get(asset_manifest_key(sha), sha256=sha)
            except NotFoundError:
                raise NotFoundError(
                    f"scene.asset: no asset {sha} is stored; upload it first (`tessera submit "
                    "SCENE` uploads a .blend or .pov with what it needs)"
                ) from None
            manifest = Manifest.parse(orjson.loads(raw), max_bytes=self.max_asset_bytes)
            paths = frozenset(f.path for f in manifest.files)
            self._paths[sha] = paths
            while len(self._paths) > REFERENCE_CACHE:
                self._paths.popitem(last=False)
        else:
            self._paths.move_to_end(sha)
        if main not in paths:
            raise ValidationError(f"scene.main: {main!r:.80} is not a file of asset {sha}")

    async def missing(self, data: bytes, headers: Headers) -> AssetMissingReply:
        """``tessera.api.asset.missing``: which of the chunks are not stored."""
        request = decode_request(data, headers, AssetMissingRequest)
        wanted = list(dict.fromkeys(request.chunks))
        held = await asyncio.gather(*(self.store.exists(asset_chunk_key(c)) for c in wanted))
        return AssetMissingReply(
            missing=[c for c, ok in zip(wanted, held, strict=True) if not ok],
            chunk_bytes=ASSET_CHUNK_BYTES,
            max_asset_bytes=self.max_asset_bytes,
            max_query=MAX_MISSING_QUERY,
        )

    async def chunk(self, data: bytes, headers: Headers) -> AssetChunkReply:
        """``tessera.api.asset.chunk``: verify one chunk's sha256, then store it once."""
        request = decode_request(data, headers, AssetChunkRequest)
        actual = await asyncio.to_thread(sha256_hex, request.data)
        if actual != request.sha256:
            raise ValidationError(
                f"data: its sha256 is {actual}, not {request.sha256} (damaged in transit? "
                "nothing was stored)"
            )
        key = asset_chunk_key(request.sha256)
        if await self.store.exists(key):
            return AssetChunkReply(request.sha256, len(request.data), stored=False)
        await self.store.put(key, request.data, sha256=actual)
        self.chunks_stored += 1
        return AssetChunkReply(request.sha256, len(request.data), stored=True)

    async def manifest(self, data: bytes, headers: Headers) -> AssetManifestReply:
        """``tessera.api.asset.manifest``: check the manifest and its chunks, then store it."""
        if len(data) >= self.intake.large_body_bytes:
            manifest, renderer = await self.intake.offload(
                parse_manifest_request, data, headers, self.max_asset_bytes
            )
        else:
            manifest, renderer = parse_manifest_request(data, headers, self.max_asset_bytes)
        await self._check_chunks(manifest)
        if renderer == "povray":
            await self._check_pov(manifest)
        body = manifest.canonical()
        digest = sha256_hex(body)
        key = asset_manifest_key(digest)
        stored = not await self.store.exists(key)
        if stored:
            await self.store.put(key, body, sha256=digest)
        self.log.info(
            "asset stored" if stored else "asset already stored",
            asset=digest,
            files=len(manifest.files),
            size=manifest.size,
        )
        return AssetManifestReply(digest, manifest.main, len(manifest.files), manifest.size, stored)

    async def _check_chunks(self, manifest: Manifest) -> None:
        """Every chunk is stored, with the size its place implies (else NotFound/Validation)."""
        expected: dict[str, int] = {}
        for f in manifest.files:
            for digest, size in zip(f.chunks, chunk_sizes(f.size), strict=True):
                if expected.setdefault(digest, size) != size:
                    raise ValidationError(
                        f"manifest: chunk {digest} stands for {expected[digest]} and {size} bytes"
                    )
        limit = asyncio.Semaphore(_PARALLEL)

        async def size_of(digest: str) -> int | None:
            async with limit:
                try:
                    return await self.store.size(asset_chunk_key(digest))
                except NotFoundError:
                    return None

        sizes = await asyncio.gather(*(size_of(d) for d in expected))
        missing = [d for d, size in zip(expected, sizes, strict=True) if size is None]
        if missing:
            shown = ", ".join(missing[:_SHOWN]) + (" ..." if len(missing) > _SHOWN else "")
            raise NotFoundError(
                f"manifest: {len(missing)} of its {len(expected)} chunks are not stored "
                f"(upload them with asset.chunk first): {shown}"
            )
        for (digest, want), got in zip(expected.items(), sizes, strict=True):
            if got != want:
                raise ValidationError(
                    f"manifest: chunk {digest} is stored with {got} bytes, its place needs {want}"
                )

    async def _check_pov(self, manifest: Manifest) -> None:
        """Every file the POV-Ray scene names is in the asset (or POV-Ray's library), and none
        uses a feature that cannot tile exactly (:func:`proto.povray.check_povray_source`)."""
        texts: dict[str, str | None] = {}

        def read(path: str) -> str | None:
            if path not in texts:
                raise _NeedText(path)
            return texts[path]

        while True:  # one more pass per include file read (pov_dependencies reads synchronously)
            try:
                pov_dependencies(manifest.main, read, lambda p: manifest.file(p) is not None)
                break
            except _NeedText as need:
                texts[need.path] = await self._text(manifest, need.path)
        for path, text in texts.items():
            if text is not None:
                check_povray_source(text, path)

    async def _text(self, manifest: Manifest, path: str) -> str | None:
        entry = manifest.file(path)
        if entry is None or entry.size > MAX_SCAN_BYTES:
            return None
        parts = [await self.store.get(asset_chunk_key(c), sha256=c) for c in entry.chunks]
        data = b"".join(parts)
        if sha256_hex(data) != entry.sha256:
            raise ValidationError(
                f"manifest: {path!r:.120}: its chunks' bytes have sha256 {sha256_hex(data)}, "
                f"not the {entry.sha256} the manifest gives"
            )
        return data.decode("latin-1")


class _NeedText(Exception):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path
