"""Fixtures for the metadata store tests: a migrated store on this test's fresh database."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from proto.names import new_job_id
from shared.metadata import MetadataStore, NewJob


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[MetadataStore]:
    """A connected, migrated store; closed after the test."""
    opened = await MetadataStore.connect(database_url, max_size=10)
    try:
        yield opened
    finally:
        await opened.close()


def make_new_job(
    *, key: str | None = None, body: dict[str, Any] | None = None, **over: Any
) -> NewJob:
    """A small valid submission; ``body`` changes the request and so the fingerprint."""
    request = body if body is not None else {"spp": 16, "width": 64, "height": 48}
    fingerprint = hashlib.sha256(repr(sorted(request.items())).encode()).hexdigest()
    fields: dict[str, Any] = {
        "job_id": new_job_id(),
        "idempotency_key": key or uuid.uuid4().hex,
        "fingerprint": fingerprint,
        "project": "demo",
        "request": request,
        "scene": {"spheres": [{"c": [0, 0, -1], "r": 0.5}], "camera": {"fov": 40}},
        "frame": 0,
        "input_hash": "in-" + fingerprint[:16],
        "width": 64,
        "height": 48,
        "spp": 16,
        "tile_size": 32,
    }
    return NewJob(**(fields | over))


@pytest.fixture
def new_job() -> Callable[..., NewJob]:
    """Factory of :class:`NewJob` values (see :func:`make_new_job`)."""
    return make_new_job


RECTS = [(0, 0, 32, 32), (32, 0, 64, 32), (0, 32, 32, 48), (32, 32, 64, 48)]
"""The tile plan of a 64×48 job with 32-pixel tiles."""
