"""Scheduler fixtures: a scheduler Runtime in-process on this test's namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.core.config import Settings
from shared.service.runtime import Runtime


@pytest.fixture
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    """A scheduler Runtime (NATS, topology, PostgreSQL, object store) for this test."""
    rt = await Runtime.open(settings, "scheduler")
    try:
        yield rt
    finally:
        await rt.close()
