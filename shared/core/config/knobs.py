"""How a knob is declared: :func:`_knob` puts its default, variable, meaning and readers on a field.

:func:`shared.core.config.settings._knobs` walks those fields; ``from_env`` reads and checks the
variable (:mod:`shared.core.config.parse`), the docs table prints the rest
(:mod:`shared.core.config.table`).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

MiB = 1024 * 1024


def _knob(
    default: Any,
    env: str,
    doc: str,
    *,
    read_by: str,
    minimum: float | None = None,
    maximum: tuple[float, str] | None = None,
) -> Any:
    """A settings field: ``default``, read from ``env``, documented by ``doc``.

    ``read_by`` names the processes that use it (the docs table's last column); ``minimum`` is
    the least value ``from_env`` accepts for a number; ``maximum`` the largest, with why (said
    in the error that refuses a larger one).
    """
    meta = {"env": env, "doc": doc, "read_by": read_by, "min": minimum, "max": maximum}
    return field(default=default, metadata=meta)
