"""Typed field readers for API request bodies.

A wrong *shape* (missing field, unknown field, wrong JSON type, a bool where a number belongs)
is a :class:`~shared.core.errors.DecodeError` (``bad_request``); a well-typed value outside a
documented limit is a :class:`~shared.core.errors.ValidationError` (``invalid``). Both messages
start with the field name and say what was expected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypeVar, overload

from shared.core.errors import DecodeError, ValidationError

_MISSING: Any = object()
T = TypeVar("T")


class Body:
    """Reads and type-checks fields of one request body; :meth:`done` rejects leftovers."""

    def __init__(self, schema: str, body: Any) -> None:
        if not isinstance(body, Mapping):
            raise DecodeError(f"{schema}: body must be an object, got {type(body).__name__}")
        bad = [k for k in body if not isinstance(k, str)]
        if bad:
            raise DecodeError(f"{schema}: object keys must be strings, got {bad[0]!r:.40}")
        self.schema, self._body, self._seen = schema, body, set[str]()

    def _get(self, name: str, default: Any) -> Any:
        self._seen.add(name)
        if name in self._body and self._body[name] is not None:
            return self._body[name]
        if default is _MISSING:
            raise DecodeError(f"{name}: required field is missing")
        return default

    @overload
    def integer(self, name: str) -> int: ...
    @overload
    def integer(self, name: str, default: T) -> int | T: ...
    def integer(self, name: str, default: Any = _MISSING) -> Any:
        """An integer (an integral float such as ``64.0`` counts), or ``default``."""
        value = self._get(name, default)
        return value if value is default else as_int(name, value)

    @overload
    def string(self, name: str) -> str: ...
    @overload
    def string(self, name: str, default: T) -> str | T: ...
    def string(self, name: str, default: Any = _MISSING) -> Any:
        """A string, or ``default``."""
        value = self._get(name, default)
        if value is not default and not isinstance(value, str):
            raise DecodeError(f"{name}: expected a string, got {type(value).__name__}")
        return value

    def integer_or(self, name: str, word: str, default: int) -> int | str:
        """An integer, the string ``word``, or ``default``."""
        value = self._get(name, default)
        if value == word:
            return word
        if isinstance(value, str):
            raise DecodeError(f"{name}: expected an integer or {word!r}, got {value!r:.40}")
        return value if value is default else as_int(name, value)

    def boolean(self, name: str, default: bool) -> bool:
        """A JSON boolean (``0``/``1`` are not booleans), or ``default``."""
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise DecodeError(f"{name}: expected a boolean, got {type(value).__name__}")
        return value

    def has(self, name: str) -> bool:
        """The field is given (and not null); it counts as read."""
        self._seen.add(name)
        return self._body.get(name) is not None

    def raw(self, name: str) -> Any:
        """The value as parsed, for fields with more than one allowed type."""
        return self._get(name, _MISSING)

    def done(self) -> None:
        """Reject fields the schema does not know (typos must not be silently ignored)."""
        extra = sorted(k for k in self._body if k not in self._seen)
        if extra:
            raise DecodeError(f"{self.schema}: unknown field(s) {', '.join(map(repr, extra))}")


def as_int(name: str, value: Any) -> int:
    """``value`` as an int: bools and non-numbers are DecodeErrors, fractions/NaN/inf invalid."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecodeError(f"{name}: expected an integer, got {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValidationError(f"{name}: {value!r} is not a finite integer")
        return int(value)
    return value


def check_range(name: str, value: int, lo: int, hi: int) -> int:
    """``value`` if ``lo <= value <= hi``, else a ValidationError naming the limit."""
    if not lo <= value <= hi:
        shown = str(value) if abs(value) < 10**30 else f"{str(value)[:20]}..."
        raise ValidationError(f"{name}: {shown} is outside the limit {lo}..{hi}")
    return value


def check_str(name: str, value: str, pattern: re.Pattern[str], max_len: int) -> str:
    """``value`` if it is at most ``max_len`` characters and matches ``pattern``."""
    if len(value) > max_len:
        raise ValidationError(f"{name}: {len(value)} characters exceeds the limit {max_len}")
    if pattern.fullmatch(value) is None:
        raise ValidationError(f"{name}: {value!r:.80} does not match {pattern.pattern}")
    return value


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0, ``[]`` is 1), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest
