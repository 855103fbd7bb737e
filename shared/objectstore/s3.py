"""The S3 object store (aioboto3): one long-lived client per store.

``put`` sends ``Content-MD5`` (the server rejects a body damaged in transit) and records the
sha256 in the object's metadata; ``get`` checks the bytes against it (and against a caller's
expected digest), so a torn or substituted object is a :class:`CorruptObject`, never data.
S3 replaces whole objects atomically, so racing writers of one key leave one whole object.

Timeouts are short and botocore's own retries bounded (``standard`` mode, one retry), so an
outage surfaces within seconds as :class:`StoreUnavailable`; the caller's retry policy decides
what then. botocore and aiohttp exceptions never leave this module.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import hashlib
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import aioboto3
import aiohttp
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from shared.core.config import ObjectStoreSettings
from shared.core.errors import (
    ConfigError,
    NotFoundError,
    StoreUnavailable,
    TesseraError,
    ValidationError,
)
from shared.objectstore.base import (
    CorruptObject,
    ObjectInfo,
    ObjectStore,
    StoreAccessDenied,
    StoreRejected,
    check_key,
    check_prefix,
    sha256_hex,
    verify,
)

META_SHA256 = "sha256"
_NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
_DENIED = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"}
    | {"InvalidToken", "ExpiredToken", "AllAccessDisabled", "AccountProblem"}
)
_RETRYABLE = frozenset(
    {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling"}
    | {"BadDigest", "IncompleteBody", "XAmzContentSHA256Mismatch", "RequestTimeTooSkewed"}
)


class S3Store(ObjectStore):
    """Objects in one S3 bucket. Build with :meth:`open`; :meth:`close` when done."""

    remote = True

    def __init__(self, client: Any, bucket: str, resources: AsyncExitStack) -> None:
        # ``client`` is an aiobotocore S3 client; its precise type needs the S3 service stubs
        # (types-aiobotocore[s3]), which are not installed, so it is ``Any`` here.
        self._client = client
        self.bucket = bucket
        self._resources = resources

    @classmethod
    async def open(
        cls,
        settings: ObjectStoreSettings,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float = 10.0,
        max_attempts: int = 2,
    ) -> S3Store:
        """Create the client (no request is made; call :meth:`ping` for readiness)."""
        if not settings.bucket:
            raise ConfigError("TESSERA_OBJECT_STORE: s3:// needs a bucket name")
        session = aioboto3.Session(
            aws_access_key_id=settings.access_key,
            aws_secret_access_key=settings.secret_key,
            region_name=settings.region,
        )
        config = AioConfig(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            max_pool_connections=32,
            s3={"addressing_style": "path"},
            # We send Content-MD5 ourselves and verify sha256 on read; S3-compatible servers
            # differ in their support of the newer flexible checksums.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        resources = AsyncExitStack()
        client = await resources.enter_async_context(
            session.client("s3", endpoint_url=settings.endpoint or None, config=config)
        )
        return cls(client, settings.bucket, resources)

    async def put(
        self, key: str, data: bytes, *, durable: bool = True, sha256: str | None = None
    ) -> str:
        check_key(key)  # (a PUT that returned is durable: ``durable`` changes nothing)
        digest = sha256 if sha256 is not None else sha256_hex(data)
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        with _translate(f"put {key}"):
            await self._client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=bytes(data),
                ContentMD5=md5,
                ContentType="application/octet-stream",
                Metadata={META_SHA256: digest},
            )
        return digest

    async def get(self, key: str, *, sha256: str | None = None) -> bytes:
        check_key(key)
        with _translate(f"get {key}"):
            reply = await self._client.get_object(Bucket=self.bucket, Key=key)
            async with reply["Body"] as body:
                data: bytes = await body.read()
        length = reply.get("ContentLength")
        if length is not None and length != len(data):
            raise StoreUnavailable(f"get {key}: read {len(data)} of {length} bytes")
        recorded = (reply.get("Metadata") or {}).get(META_SHA256)
        if recorded is not None and recorded != sha256_hex(data):
            raise CorruptObject(f"object {key}: content does not match its recorded sha256")
        return verify(key, data, sha256)

    async def size(self, key: str) -> int:
        check_key(key)
        with _translate(f"size {key}"):
            head = await self._client.head_object(Bucket=self.bucket, Key=key)
        return int(head["ContentLength"])

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        check_key(key)
        if offset < 0 or length < 0:
            raise ValidationError(f"range {offset}+{length} of {key}: negative")
        if length == 0:
            return b""
        try:
            with _translate(f"get {key} [{offset}+{length}]"):
                reply = await self._client.get_object(
                    Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}"
                )
                async with reply["Body"] as body:
                    data: bytes = await body.read()
        except StoreRejected:  # 416: the range starts past the end (like a file read there)
            if offset >= await self.size(key):
                return b""
            raise
        return data

    async def presign_get(self, key: str, expires: int) -> str | None:
        check_key(key)
        with _translate(f"presign {key}"):
            url: str = await self._client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires
            )
        return url

    async def exists(self, key: str) -> bool:
        check_key(key)
        try:
            with _translate(f"exists {key}"):
                await self._client.head_object(Bucket=self.bucket, Key=key)
        except NotFoundError:
            return False
        return True

    async def delete(self, key: str) -> None:
        check_key(key)
        with _translate(f"delete {key}"):
            await self._client.delete_object(Bucket=self.bucket, Key=key)

    async def list(self, prefix: str, *, limit: int | None = None) -> builtins.list[ObjectInfo]:
        check_prefix(prefix)
        found: builtins.list[ObjectInfo] = []
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": 1000}
        )
        with _translate(f"list {prefix!r}"):
            async for page in pages:
                for item in page.get("Contents", []):
                    modified = item["LastModified"].timestamp()
                    found.append(ObjectInfo(key=item["Key"], size=item["Size"], modified=modified))
                if limit is not None and len(found) >= limit:
                    break
        found.sort(key=lambda info: info.key)
        return found if limit is None else found[:limit]

    async def ping(self) -> None:
        try:
            with _translate(f"ping bucket {self.bucket}"):
                await self._client.head_bucket(Bucket=self.bucket)
        except NotFoundError as exc:
            raise ConfigError(
                f"TESSERA_OBJECT_STORE: bucket {self.bucket!r} does not exist"
            ) from exc

    async def close(self) -> None:
        await self._resources.aclose()


@contextlib.contextmanager
def _translate(what: str) -> Iterator[None]:
    """botocore/aiohttp exceptions as our error tree (see :mod:`shared.objectstore.base`)."""
    try:
        yield
    except ClientError as exc:
        raise _from_client_error(what, exc) from exc
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise StoreAccessDenied(f"{what}: no usable S3 credentials: {exc}") from exc
    except (TimeoutError, BotoCoreError, aiohttp.ClientError, OSError) as exc:
        raise StoreUnavailable(f"{what}: object store unreachable: {exc}") from exc


def _from_client_error(what: str, exc: ClientError) -> TesseraError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    text = f"{what}: {code or status}: {error.get('Message', '')}".rstrip(": ")
    if code in _NOT_FOUND or (status == 404 and code != "NoSuchBucket"):
        return NotFoundError(text)
    if code == "NoSuchBucket":
        return ConfigError(f"{text} (TESSERA_OBJECT_STORE names a missing bucket)")
    if code in _DENIED or status in (401, 403):
        return StoreAccessDenied(f"{text} (check TESSERA_S3_ACCESS_KEY / TESSERA_S3_SECRET_KEY)")
    if code in _RETRYABLE or status >= 500 or status == 429:
        return StoreUnavailable(text)
    return StoreRejected(text)
