"""Canonical JSON: one byte string per logical value, for hashing.

Rules: object keys must be strings and are sorted (by code point); no whitespace; UTF-8;
``true``/``false``/``null`` as usual (a bool is never a number); integers stay integers and must
fit in a signed 64-bit range; a float with no fractional part inside that range becomes an
integer (``1.0 → 1``, ``-0.0 → 0``), so an int and an equal float hash alike; other floats
(``2.5``, ``1e+300``) use the shortest round-trip form; NaN and ±inf are rejected;
tuples are arrays; anything else (bytes, sets, objects) is rejected. Nesting deeper than
:data:`MAX_DEPTH` is rejected. Violations raise :class:`ValidationError` naming the JSON path.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import orjson

from shared.core.errors import ValidationError

MAX_DEPTH = 64
"""Deepest nesting of arrays/objects accepted (the top level is depth 1)."""

INT_MIN = -(2**63)
INT_MAX = 2**63 - 1


def normalize(value: Any, path: str = "$", depth: int = 0) -> Any:
    """Return ``value`` with numbers normalised and containers copied; raise on non-JSON."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise ValidationError(f"{path}: integer {value} is outside the signed 64-bit range")
        return value
    if isinstance(value, float):
        return _normalize_float(value, path)
    if depth >= MAX_DEPTH:
        raise ValidationError(f"{path}: nesting deeper than {MAX_DEPTH}")
    if isinstance(value, list | tuple):
        return [normalize(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(f"{path}: object key {key!r} is not a string")
            out[key] = normalize(item, f"{path}.{key}", depth + 1)
        return out
    raise ValidationError(f"{path}: {type(value).__name__} is not a JSON value")


def _normalize_float(value: float, path: str) -> int | float:
    if not math.isfinite(value):
        raise ValidationError(f"{path}: {value} is not a finite number")
    if value.is_integer() and INT_MIN <= value < -INT_MIN:  # ints beyond this are refused
        return int(value)
    return value


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes of ``value`` (see the module docstring for the rules)."""
    try:
        return orjson.dumps(normalize(value), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:  # e.g. a lone surrogate in a string
        raise ValidationError(f"$: not encodable as JSON: {exc}") from exc


def canonical_hash(value: Any) -> str:
    """sha256 hex digest of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
