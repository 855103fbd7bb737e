"""Downloading a render without object-store credentials, end to end, for both stores.

The four services run as processes with the store's settings; the client (the Python API and
the ``tessera get`` command as a process of its own) has only the NATS URL and namespace.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.client.api import TesseraClient, fetch_url
from shared.core.config import Settings
from shared.devstack.stack import S3_ACCESS_KEY, S3_BUCKET, S3_SECRET_KEY, SeaweedS3
from shared.objectstore import open_object_store, sha256_hex
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, settle, submit
from tests.harness import ServiceProcesses

ROOT = Path(__file__).resolve().parents[2]
#: 256x192: its float image is larger than one chunk of a default (1 MiB max_payload) server
BODY = request(width=256, height=192, spp=2, tile_size=64)


def tessera_get(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``tessera get ...`` as its own process with only the client's variables."""
    keep = {k: env[k] for k in ("TESSERA_NATS_URL", "TESSERA_NAMESPACE")}
    client_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)} | keep
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "get", *args],
        env=client_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,  # subprocess.run kills the child when this runs out
        check=False,
    )


async def _render(client: TesseraClient, procs: ServiceProcesses) -> dict[str, object]:
    procs.start_all(workers=1)
    reply = await submit(client, BODY)
    status = await settle(client, reply["job_id"], procs, timeout=180)
    assert status["state"] == "completed", status
    return status


async def test_directory_store_chunks_and_tessera_get(
    services: ServiceProcesses,
    client: TesseraClient,
    e2e_env: dict[str, str],
    e2e_settings: Settings,
    tmp_path: Path,
) -> None:
    status = await _render(client, services)
    job_id = str(status["job_id"])
    first = await client.result(job_id, kind="float")
    assert first["url"] is None and first["next_offset"] is not None, "more than one chunk"
    floats = await client.download(job_id, kind="float")
    async with await open_object_store(e2e_settings.object_store) as objects:
        assert floats == await objects.get(str(status["float_location"]))
    assert sha256_hex(floats) == first["sha256"]
    png, npy = tmp_path / "out.png", tmp_path / "out.npy"
    done = await asyncio.to_thread(
        tessera_get, e2e_env, job_id, "-o", str(png), "--float", str(npy)
    )
    assert done.returncode == 0, done.stderr
    assert png.read_bytes() == reference_png(BODY) and npy.read_bytes() == floats


@pytest.fixture
def s3_services(
    e2e_env: dict[str, str], seaweed: SeaweedS3, tmp_path: Path
) -> Iterator[tuple[ServiceProcesses, dict[str, str]]]:
    env = e2e_env | {
        "TESSERA_OBJECT_STORE": f"s3://{S3_BUCKET}",
        "TESSERA_S3_ENDPOINT": seaweed.endpoint,
        "TESSERA_S3_ACCESS_KEY": S3_ACCESS_KEY,
        "TESSERA_S3_SECRET_KEY": S3_SECRET_KEY,
    }
    procs = ServiceProcesses(env, tmp_path / "s3-logs")
    try:
        yield procs, env
    finally:
        procs.stop_all()


async def test_s3_store_presigned_url_and_tessera_get(
    s3_services: tuple[ServiceProcesses, dict[str, str]], client: TesseraClient, tmp_path: Path
) -> None:
    procs, env = s3_services
    status = await _render(client, procs)
    job_id = str(status["job_id"])
    reply = await client.result(job_id)
    assert reply["url"] is not None and reply["expires_at"] is not None
    assert S3_SECRET_KEY not in reply["url"]
    png = await fetch_url(reply["url"], 10)  # plain HTTP from loopback
    assert png == reference_png(BODY) and sha256_hex(png) == reply["sha256"]
    floats = await client.download(job_id, kind="float", inline=True)
    assert sha256_hex(floats) == (await client.result(job_id, kind="float"))["sha256"]
    out = tmp_path / "s3.png"
    done = await asyncio.to_thread(tessera_get, env, job_id, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == png
    inline = tmp_path / "inline.png"
    done = await asyncio.to_thread(tessera_get, env, job_id, "-o", str(inline), "--inline")
    assert done.returncode == 0, done.stderr
    assert inline.read_bytes() == png
