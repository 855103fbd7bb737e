"""End-to-end fixtures: the four services as separate OS processes on this test's namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nats.aio.client import Client as NATS

import kernel
from proto.api import SubmitRequest
from proto.names import Names
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.metadata import MetadataStore
from shared.objectstore import ObjectStore, open_object_store
from tests.harness import ServiceProcesses

#: Short timings so crashes and takeovers resolve in seconds (see docs/operations.md for prod).
FAST = {
    "TESSERA_LEASE_TTL": "2",
    "TESSERA_HEARTBEAT_INTERVAL": "0.5",
    "TESSERA_ACK_WAIT": "4",
    "TESSERA_CHECKPOINT_INTERVAL": "0.2",
    "TESSERA_SAMPLES_PER_PASS": "2",
    "TESSERA_PASS_SECONDS": "0.1",  # a stop (cancel, SIGTERM) lands within ~0.1 s
    "TESSERA_SWEEP_INTERVAL": "0.5",
    "TESSERA_SWEEP_AGE": "3",
    "TESSERA_RETRY_BASE": "0.2",
    "TESSERA_RETRY_CAP": "2",
    "TESSERA_GRACE_PERIOD": "5",
    "TESSERA_WORKER_SLOTS": "2",
    "TESSERA_LOG_LEVEL": "INFO",
}


@pytest.fixture
def e2e_env(settings_env: dict[str, str], database_url: str) -> dict[str, str]:
    """The environment every service process of this test gets."""
    return settings_env | FAST


@pytest.fixture
def services(e2e_env: dict[str, str], tmp_path: Path) -> Iterator[ServiceProcesses]:
    """Service processes of this test; all stopped (by PID) afterwards."""
    procs = ServiceProcesses(e2e_env, tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture
def e2e_settings(e2e_env: dict[str, str]) -> Settings:
    """Settings matching the service processes."""
    return Settings.from_env(e2e_env)


@pytest.fixture
async def client(nc: NATS, e2e_settings: Settings) -> TesseraClient:
    """An API client on this test's namespace."""
    return TesseraClient(nc, Names(e2e_settings.deployment.namespace), timeout=10)


@pytest.fixture
async def db(e2e_settings: Settings) -> AsyncIterator[MetadataStore]:
    """Direct access to this test's metadata store (for invariant checks)."""
    store = await MetadataStore.connect(e2e_settings.database_url)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def objects(e2e_settings: Settings) -> AsyncIterator[ObjectStore]:
    """Direct access to this test's object store."""
    store = await open_object_store(e2e_settings.object_store)
    try:
        yield store
    finally:
        await store.close()


def reference_png(request: dict[str, Any]) -> bytes:
    """The PNG of an uninterrupted, in-process render of the same request."""
    req = SubmitRequest(**request)  # the API's defaults, as the gateway applies them
    doc = kernel.builtin_scene(req.scene) if isinstance(req.scene, str) else req.scene
    settings = kernel.RenderSettings(
        width=req.width, height=req.height, spp=req.spp, max_depth=req.max_depth, seed=req.seed
    )
    prepared = kernel.prepare(doc, req.frame, settings)
    acc = np.zeros((settings.height, settings.width, 3), dtype=np.float64)
    kernel.render_full(prepared, 0, settings.spp, acc, parallel=False)
    return kernel.encode_png(acc, settings.spp)
