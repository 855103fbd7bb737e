"""Chaos fixtures: the e2e environment (FAST timings) and a table of scenario outcomes.

Every scenario records one row (:func:`record`); the rows are printed at the end of the run
(``pytest -s`` or not: the terminal summary always shows) and written to
``<basetemp>/chaos-scenarios.txt``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chaos.table import render_table
from tests.e2e.conftest import FAST

_ROWS: list[dict[str, Any]] = []
_COLUMNS = ("scenario", "outcome", "kills", "resumes", "takeovers", "dups", "dlq", "violations",
            "seconds")  # fmt: skip


def record(row: dict[str, Any]) -> None:
    """Add one scenario's numbers to the table."""
    _ROWS.append(row)


@pytest.fixture
def chaos_env(settings_env: dict[str, str], database_url: str) -> dict[str, str]:
    """The environment of every service process of a scenario on the session servers."""
    return settings_env | FAST


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not _ROWS:
        return
    table = render_table(_COLUMNS, _ROWS)
    terminalreporter.write_sep("=", "chaos scenarios")
    terminalreporter.write_line(table)
    base = Path(str(config._tmp_path_factory.getbasetemp()))  # type: ignore[attr-defined]
    (base / "chaos-scenarios.txt").write_text(table + "\n")
