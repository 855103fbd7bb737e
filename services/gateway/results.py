"""The result verb: a completed job's image for a client without object-store credentials.

Where the store can sign URLs (S3) and the client did not ask for ``inline``, the reply is a
presigned GET URL valid ``TESSERA_RESULT_URL_TTL`` seconds (the client downloads straight from
the store). Otherwise the image comes over NATS a chunk per request: each reply carries at most
:func:`chunk_bytes` bytes (base64), so it stays inside the gateway's reply budget (half the
server's ``max_payload``); the client asks again from ``next_offset`` and checks the total
``size`` and ``sha256`` at the end. Chunks are read by range, never the whole object per request.

Every reply names the whole object's sha256: the PNG's is recorded on the job, the float image's
is in its content-addressed key (:func:`shared.objectstore.render_sha256`); an object under any
other key is hashed once per request (only images written by hand are stored that way).
"""

from __future__ import annotations

import asyncio
import base64
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from proto.api import ResultKind, ResultRequest, decode_request
from proto.api_replies import ResultReply
from services.gateway.views import iso
from shared.core.errors import NotFoundError, StoreUnavailable, ValidationError
from shared.core.lifecycle import IllegalTransition, JobState
from shared.metadata import MetadataStore
from shared.metadata.models import Job
from shared.objectstore import ObjectStore, render_sha256, sha256_hex

__all__ = ["CONTENT_TYPES", "ResultHandlers", "chunk_bytes"]

Headers = Mapping[str, str] | None
CONTENT_TYPES: dict[ResultKind, str] = {"png": "image/png", "float": "application/x-npy"}
#: the JSON around ``data_b64`` (ids, digest, offsets) is well below this
ENVELOPE_BYTES = 1024


def chunk_bytes(reply_budget: int) -> int:
    """Raw bytes of one chunk: their base64 (4 characters per 3 bytes) and the envelope fit."""
    return max(3, (reply_budget - ENVELOPE_BYTES) // 4 * 3)


class ResultHandlers:
    """``tessera.api.result`` over one metadata store and one object store."""

    def __init__(
        self, db: MetadataStore, store: ObjectStore, *, reply_budget: int, url_ttl: int
    ) -> None:
        self.db, self.store, self.url_ttl = db, store, url_ttl
        #: the most bytes one chunk reply carries
        self.chunk = chunk_bytes(reply_budget)
        #: digests of objects not under a content-addressed key, by (key, size): hashed once,
        #: off the event loop, not once per chunk request
        self._digests: OrderedDict[tuple[str, int], str] = OrderedDict()

    async def result(self, data: bytes, headers: Headers) -> ResultReply:
        """A presigned URL for the image, or one chunk of its bytes (see the module doc)."""
        request = decode_request(data, headers, ResultRequest)
        job = await self.db.get_job(request.job_id)
        if job is None:
            raise NotFoundError(f"job {request.job_id} does not exist")
        key, sha = _located(job, request.kind)
        size = await self.store.size(key)
        if sha is None:
            sha = await self._digest(key, size)
        kind, content_type = request.kind, CONTENT_TYPES[request.kind]
        if not request.inline:
            signed_at = datetime.now(UTC)  # before signing: expires_at is never late
            url = await self.store.presign_get(key, self.url_ttl)
            if url is not None:
                expires = iso(signed_at + timedelta(seconds=self.url_ttl))
                return ResultReply(
                    job_id=job.job_id, kind=kind, content_type=content_type, size=size,
                    sha256=sha, url=url, expires_at=expires, offset=0, length=0,
                    data_b64=None, next_offset=None,
                )  # fmt: skip
        offset, chunk = request.offset, await self._read(key, size, request)
        end = offset + len(chunk)
        return ResultReply(
            job_id=job.job_id, kind=kind, content_type=content_type, size=size, sha256=sha,
            url=None, expires_at=None, offset=offset, length=len(chunk),
            data_b64=base64.b64encode(chunk).decode(), next_offset=end if end < size else None,
        )  # fmt: skip

    async def _digest(self, key: str, size: int) -> str:
        """sha256 of the object at ``key``, computed once (in a thread) and remembered."""
        cached = self._digests.get((key, size))
        if cached is None:
            cached = await asyncio.to_thread(sha256_hex, await self.store.get(key))
            self._digests[(key, size)] = cached
            while len(self._digests) > _DIGESTS:
                self._digests.popitem(last=False)
        self._digests.move_to_end((key, size))
        return cached

    async def _read(self, key: str, size: int, request: ResultRequest) -> bytes:
        offset = request.offset
        if offset > size:
            raise ValidationError(f"offset: {offset} is past the end of the {size}-byte object")
        want = min(request.length or self.chunk, self.chunk, size - offset)
        data = await self.store.get_range(key, offset, want)
        if len(data) != want:  # the object is content-addressed: it cannot have shrunk
            raise StoreUnavailable(f"read {len(data)} of {want} bytes of {key} at {offset}")
        return data


_DIGESTS = 64
"""Digests :class:`ResultHandlers` keeps (least recently used dropped)."""


def _located(job: Job, kind: ResultKind) -> tuple[str, str | None]:
    """The object key and (if known) sha256 of a completed job's image of ``kind``."""
    if job.state is not JobState.COMPLETED or job.result_location is None:
        raise IllegalTransition(
            f"job {job.job_id} is {job.state.value}: only a completed job has a result"
        )
    if kind == "png":
        return job.result_location, job.result_sha256
    if job.float_location is None:
        raise NotFoundError(f"job {job.job_id} has no float image")
    return job.float_location, render_sha256(job.float_location)
