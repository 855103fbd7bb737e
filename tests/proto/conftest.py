"""A throwaway single-node nats-server for the proto tests.

Stop-gap until the shared session stack in ``tests/conftest.py`` lands: it starts
``nats-server -js`` on a free loopback port in a temporary store directory and kills it by PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

NATS_SERVER = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "nats-server"
START_TIMEOUT = 10.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nats-server did not listen on {port} within {START_TIMEOUT} s")


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a fresh JetStream-enabled nats-server, private to the test module."""
    store = tmp_path_factory.mktemp("nats")
    port = _free_port()
    cmd = [str(NATS_SERVER), "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        _wait_for_port(port, proc)
        yield f"nats://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    """A connection to the module's server, closed after the test."""
    client = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        yield client
    finally:
        await client.close()
