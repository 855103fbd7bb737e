"""Files the client writes are whole and ordinary."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from services.client.output import write_atomic
from services.client.recovery import requeue_table


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


def test_requeue_table_says_how_many_letters_it_does_not_list() -> None:
    letter = {"seq": 4, "job_id": "j1", "tile": 2, "action": "requeue", "why": "tile dead",
              "reason": "terminal", "error": "boom", "done": True}  # fmt: skip
    reply = {"dry_run": False, "requeued": 3, "skipped": 0, "examined": 3,
             "dead_letters": [letter], "omitted": 2}  # fmt: skip
    lines = requeue_table(reply).splitlines()
    assert lines[0].split()[:5] == ["4", "j1", "tile", "2", "requeue"]
    assert lines[1] == "... and 2 more dead letter(s), not listed (reply size)"
    assert lines[2] == "requeued 3, skipped 0"
    assert "more dead letter" not in requeue_table(reply | {"omitted": 0})
