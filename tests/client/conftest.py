"""Client fixtures: the CLI run in a worker thread (it owns its event loop) with this test's env.

The gateway runs in-process on the test's loop (fixtures shared with ``tests/gateway``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from services import cli
from tests.gateway.conftest import gateway, runtime  # noqa: F401  (fixtures)


@dataclass
class Result:
    """Exit status and captured output of one CLI run."""

    status: int
    out: str
    err: str


CliRunner = Callable[..., Coroutine[Any, Any, Result]]


@pytest.fixture
def env(settings_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This test's TESSERA_* variables, set in the process environment."""
    for key, value in settings_env.items():
        monkeypatch.setenv(key, value)
    return settings_env


@pytest.fixture
def tessera(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> CliRunner:
    """``await tessera("status", job)``: run the ``tessera`` command and capture its output."""

    async def run(*argv: str) -> Result:
        capsys.readouterr()
        status = await asyncio.to_thread(cli.main, list(argv))
        captured = capsys.readouterr()
        return Result(status, captured.out, captured.err)

    return run
