"""The field names of a dataclass, looked up once per class (a hot path reads them per tile)."""

from __future__ import annotations

import dataclasses

__all__ = ["field_names"]

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The field names of dataclass ``cls``, in declaration order."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names
