"""Object stores: one interface, a directory and an S3 implementation, and the key builders.

Other modules use only what this package exports::

    store = await open_object_store(settings.object_store)
    digest = await store.put(tile_result_key(job, i, sha), data, durable=False)
    data = await store.get(key, sha256=digest)   # CorruptObject if the bytes differ

See :mod:`shared.objectstore.base` for the error types. :class:`S3Store` (aioboto3, part of the
``render`` extra) is imported on first use, so the client-only install can use the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.core.config import ObjectStoreSettings
from shared.core.errors import ConfigError
from shared.objectstore.base import (
    CorruptObject,
    ObjectInfo,
    ObjectStore,
    StoreAccessDenied,
    StoreRejected,
    check_key,
    sha256_hex,
)
from shared.objectstore.directory import DirectoryStore
from shared.objectstore.keys import (
    asset_chunk_key,
    asset_manifest_key,
    checkpoint_key,
    render_key,
    render_sha256,
    tile_result_key,
)

if TYPE_CHECKING:
    from shared.objectstore.s3 import S3Store

__all__ = [
    "CorruptObject",
    "DirectoryStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Store",
    "StoreAccessDenied",
    "StoreRejected",
    "asset_chunk_key",
    "asset_manifest_key",
    "check_key",
    "checkpoint_key",
    "open_object_store",
    "render_key",
    "render_sha256",
    "sha256_hex",
    "tile_result_key",
]


async def open_object_store(settings: ObjectStoreSettings) -> ObjectStore:
    """The store ``settings`` names (``file``: a directory; ``s3``: a bucket)."""
    if settings.kind == "file":
        if not settings.path:
            raise ConfigError(
                "TESSERA_OBJECT_STORE is not set (or file:// has no absolute directory): "
                "this command reads the object store directly"
            )
        return await DirectoryStore.open(Path(settings.path))
    if settings.kind == "s3":
        from shared.objectstore.s3 import S3Store  # aioboto3: only where S3 is used

        return await S3Store.open(settings)
    raise ConfigError(f"TESSERA_OBJECT_STORE: unknown store kind {settings.kind!r}")


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name != "S3Store":
            raise AttributeError(f"module 'shared.objectstore' has no attribute {name!r}")
        from shared.objectstore.s3 import S3Store

        return S3Store
