"""``TESSERA_POVRAY_PROCESSES``: how many POV-Ray processes a worker runs at once."""

from __future__ import annotations

import pytest

from services.worker.renderers import probe
from services.worker.renderers.povray import create
from shared.core.errors import ConfigError
from tests.renderers.conftest import require


def test_the_processes_default_to_the_tiles_in_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    require("povray")
    found = probe("povray")
    assert found is not None
    for name in ("TESSERA_POVRAY_PROCESSES", "TESSERA_WORKER_IN_HAND"):
        monkeypatch.delenv(name, raising=False)
    assert create(found, 2).processes == 4, "twice the kernel threads"
    monkeypatch.setenv("TESSERA_WORKER_IN_HAND", "6")
    assert create(found, 2).processes == 6, "the tiles in hand"
    monkeypatch.setenv("TESSERA_POVRAY_PROCESSES", "8")
    assert create(found, 2).processes == 8
    monkeypatch.setenv("TESSERA_POVRAY_PROCESSES", "-1")
    with pytest.raises(ConfigError, match="TESSERA_POVRAY_PROCESSES"):
        create(found, 2)
