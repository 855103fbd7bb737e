"""Operations fixtures: scrape /metrics over HTTP, run the ``tessera`` CLI, services with ports.

The end-to-end fixtures (services as OS processes, client, db, objects) come from
``tests/e2e/conftest.py``; every service started here gets its own free metrics port.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services import cli
from shared.devstack.procs import ManagedProcess, free_port
from tests.e2e.conftest import (  # noqa: F401  (fixtures)
    client,
    db,
    e2e_env,
    e2e_settings,
    objects,
    services,
)
from tests.harness import ServiceProcesses
from tests.helpers import eventually

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Result:
    """Exit status and captured output of one CLI run."""

    status: int
    out: str
    err: str


CliRunner = Callable[..., Coroutine[Any, Any, Result]]


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    """GET ``http://127.0.0.1:<port><path>``: status and body (an error status is returned)."""

    def get() -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    return await asyncio.to_thread(get)


async def scrape(port: int) -> Samples:
    """Every sample of a process's /metrics, keyed by (name, sorted labels)."""
    status, body = await http_get(port, "/metrics")
    assert status == 200, body
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist yet (nothing counted)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def metric(port: int, name: str, **labels: str) -> float:
    """Scrape and read one sample."""
    return value(await scrape(port), name, **labels)


def start_with_port(
    procs: ServiceProcesses, service: str, *, name: str | None = None, **env: str
) -> tuple[ManagedProcess, int]:
    """Start a service with its own metrics port on loopback; the process and the port."""
    port = free_port()
    ops = {"TESSERA_METRICS_PORT": str(port), "TESSERA_METRICS_HOST": "127.0.0.1"}
    proc = procs.start(service, name=name, env=ops | env)
    return proc, port


async def wait_ready(port: int, proc: ManagedProcess, timeout: float = 60) -> None:
    """Until the service's /readyz answers 200 (it connected to everything)."""

    async def ready() -> bool:
        assert proc.alive(), proc.log_tail()
        try:
            status, _ = await http_get(port, "/readyz")
        except OSError:
            return False
        return status == 200

    await eventually(ready, timeout=timeout, interval=0.1, what=f"{proc.name} is ready")


@pytest.fixture
def tessera(
    e2e_env: dict[str, str],  # noqa: F811  (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> CliRunner:
    """``await tessera("dlq", "list")``: the CLI with this test's environment, output captured."""
    for key, val in e2e_env.items():
        monkeypatch.setenv(key, val)

    async def run(*argv: str) -> Result:
        capsys.readouterr()
        status = await asyncio.to_thread(cli.main, list(argv))
        captured = capsys.readouterr()
        return Result(status, captured.out, captured.err)

    return run
