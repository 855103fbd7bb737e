"""Plain-text tables for the chaos scenario summary and the soak report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def render_table(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    """A left-aligned table with a header rule."""
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
