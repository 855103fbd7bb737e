"""The four services as OS processes with renderer workers, for the full-stack renderer tests.

Gateway, scheduler and finalizer are ``python -m services.<name>``; a worker is
``python -m tests.renderers.asset_worker`` (a worker with an asset cache, see there) or, for a
worker that needs no assets, the real ``python -m services.worker``. Every process is started
through :class:`~tests.harness.ServiceProcesses` (own process group, parent-death guard, log),
so ``stop_all`` stops it by PID.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from proto.api import SubmitRequest
from services.client.api import TesseraClient
from services.client.assets import upload_scene
from shared.core.tiles import Accumulator, load_npy
from shared.devstack.procs import ManagedProcess
from shared.metadata import MetadataStore
from shared.objectstore import ObjectStore
from tests.harness import ServiceProcesses
from tests.renderers.conftest import ROOT

#: one kernel slot (one Blender process) per worker, Blender's 32-sample passes
RENDER_ENV = {"TESSERA_WORKER_SLOTS": "1", "TESSERA_LOG_LEVEL": "INFO"}


def start_worker(
    procs: ServiceProcesses, name: str, cache: Path, env: Mapping[str, str] | None = None
) -> ManagedProcess:
    """A worker with an asset cache under ``cache`` (``tests.renderers.asset_worker``)."""
    full_env = (
        os.environ
        | procs.env
        | {"TESSERA_NODE": name, "TESSERA_ASSET_CACHE_DIR": str(cache / name)}
        | dict(env or {})
    )
    proc = ManagedProcess(
        name,
        [sys.executable, "-m", "tests.renderers.asset_worker"],
        procs.log_dir / f"{name}.log",
        env=full_env,
        cwd=ROOT,
    )
    proc.start()
    procs.procs[name] = proc
    return proc


def start_services(procs: ServiceProcesses) -> None:
    """Gateway, scheduler and finalizer."""
    for service in ("gateway", "scheduler", "finalizer"):
        procs.start(service)


def children_named(pid: int, name: str) -> list[int]:
    """PIDs of the live children of ``pid`` whose executable is ``name``."""
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    out = []
    for kid in kids:
        try:
            if kid.name() == name and kid.status() != psutil.STATUS_ZOMBIE:
                out.append(kid.pid)
        except psutil.NoSuchProcess:
            continue
    return out


async def submit_asset_job(client: TesseraClient, main: Path, renderer: str, **request: Any) -> str:
    """Upload ``main`` (and what it needs) and submit a job of ``renderer`` on it; its id."""
    sha, rel = await upload_scene(client, main, renderer, progress=False)
    body: dict[str, Any] = {"project": "renderers", "renderer": renderer}
    body["scene"] = {"asset": sha, "main": rel}
    reply = await client.submit(SubmitRequest(**(body | request)))
    return str(reply["job_id"])


async def tile_results(
    db: MetadataStore, objects: ObjectStore, job_id: str
) -> dict[int, Accumulator]:
    """Every committed tile's accumulator (inline in its row, or in the object store)."""
    inline = await db.tile_results(job_id)
    out: dict[int, Accumulator] = {}
    for tile in await db.list_tiles(job_id):
        if tile.tile_index in inline:
            out[tile.tile_index] = load_npy(inline[tile.tile_index][1])
        elif tile.result_key is not None:
            out[tile.tile_index] = load_npy(await objects.get(tile.result_key))
    return out
