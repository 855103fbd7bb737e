"""Files the client writes are whole and ordinary."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from services.client.output import write_atomic


def test_write_atomic_leaves_an_ordinary_file_and_no_temporary(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        target = tmp_path / "out.png"
        write_atomic(target, b"png bytes")
    finally:
        os.umask(umask)
    assert target.read_bytes() == b"png bytes"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]
