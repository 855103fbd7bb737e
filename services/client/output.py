"""Human-readable renderings of replies, and atomic file writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from shared.objectstore.directory import commit_temp, write_temp

__all__ = [
    "cannot_write",
    "dead_letters_table",
    "jobs_table",
    "percent",
    "projects_table",
    "status_text",
    "table_lines",
    "write_atomic",
]


def percent(done: int, total: int) -> str:
    """``done/total (p%)``."""
    share = 100.0 * done / total if total else 0.0
    return f"{done}/{total} ({share:.0f}%)"


def tile_text(s: dict[str, Any]) -> str:
    """The tile edge of a status: ``64``, ``184 (auto)``, or ``auto (not planned yet)``."""
    if not s.get("tile_auto"):
        return str(s["tile_size"])
    return f"{s['tile_size']} (auto)" if s["tile_size"] else "auto (not planned yet)"


def status_text(s: dict[str, Any]) -> str:
    """A status reply as aligned ``name  value`` lines."""
    rows = [
        ("job", s["job_id"]),
        ("state", f"{s['state']} (generation {s['generation']})"),
        ("project", f"{s['project']}, frame {s['frame']}"),
        ("image", f"{s['width']}x{s['height']}, {s['spp']} spp, tiles of {tile_text(s)}"),
        ("tiles", percent(s["tiles_done"], s["tiles_total"])),
        ("samples", percent(s["samples_done"], s["samples_total"])),
    ]
    rows.append(("renderer", s.get("renderer", "tessera")))
    rows.append(("priority", str(s.get("priority", 50))))
    if s.get("deadline_at"):
        rows.append(("deadline", s["deadline_at"]))
    if s.get("state") == "paused":
        rows.append(("paused", "yes: nothing is released; `tessera resume` continues it"))
    if s.get("waiting"):
        rows.append(("waiting", s["waiting"]))
    if s.get("cancel_requested"):
        rows.append(("cancel", "requested"))
    if s.get("result_location"):
        rows.append(("result", f"{s['result_location']} (sha256 {s['result_sha256']})"))
    if s.get("float_location"):
        rows.append(("float", s["float_location"]))
    if s.get("last_error_code"):
        rows.append(("error", f"{s['last_error_code']}: {s['last_error']}"))
    rows += [("created", s["created_at"]), ("updated", s["updated_at"])]
    if s.get("finished_at"):
        rows.append(("finished", s["finished_at"]))
    return "\n".join(f"{name:<9}{value}" for name, value in rows)


def table_lines(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    """``header`` and ``rows`` as left-aligned columns two spaces apart, one string a line."""
    cells = [header, *(tuple(str(c) for c in row) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    return "\n".join(table_lines(header, rows))


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    """``list`` jobs as a table."""
    rows = [
        (
            j["job_id"],
            j["project"],
            j["state"],
            j.get("priority", ""),
            j["frame"],
            f"{j['width']}x{j['height']}",
            j["spp"],
            j["created_at"],
            j.get("deadline_at") or "-",
        )
        for j in jobs
    ]
    header = ("JOB", "PROJECT", "STATE", "PRI", "FRAME", "SIZE", "SPP", "CREATED", "DEADLINE")
    return _table(header, rows)


def projects_table(projects: list[dict[str, Any]]) -> str:
    """``project list`` as a table (share in percent of the window's core-seconds)."""
    rows = [
        (
            p["name"],
            f"{p['weight']:g}" + ("" if p["configured"] else " (default)"),
            "-" if p["max_in_flight"] is None else p["max_in_flight"],
            p["queued"],
            p["in_flight"],
            f"{p['core_seconds']:.1f}",
            f"{100 * p['share']:.1f}%",
        )
        for p in projects
    ]
    header = ("PROJECT", "WEIGHT", "MAX_IN_FLIGHT", "QUEUED", "IN_FLIGHT", "CORE_S", "SHARE")
    return _table(header, rows)


def dead_letters_table(letters: list[dict[str, Any]]) -> str:
    """``dlq list`` entries as a table."""
    rows = [
        (d["seq"], d.get("job_id", "?"), d.get("unit", "?"), d.get("reason", "malformed"),
         d.get("deliveries", ""), (d.get("error") or d.get("malformed") or "")[:60])
        for d in letters
    ]  # fmt: skip
    return _table(("SEQ", "JOB", "UNIT", "REASON", "DELIVERIES", "ERROR"), rows)


def cannot_write(path: Path) -> str | None:
    """Why ``path`` cannot be written (its directory is missing or not writable), or None.

    Checked before slow work (a download, a render), so it is not lost at the last step.
    """
    folder = path.parent
    if folder.is_dir() and os.access(folder, os.W_OK | os.X_OK):
        return None
    return f"cannot write {path}: {folder} is not a writable directory"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all, durably: a temporary file next to it,
    fsynced, renamed over ``path``, then the directory fsynced (the object store's own way).

    The file is an ordinary one (0666 less the umask). ``OSError`` if the directory is
    missing or not writable.
    """
    commit_temp(write_temp(path, data, mode=0o666), path)
