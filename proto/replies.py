"""API replies: ``{"ok": true, ...}`` or ``{"ok": false, "error": {"code": ..., "message": ...}}``.

Replies are always JSON. ``code`` is one of the closed set :class:`ErrorCode`; ``message`` is for
humans (at most :data:`MAX_MESSAGE` characters) and is never parsed by programs. A ``busy`` error
also carries ``retry_after``: seconds to wait before sending the same request again
(``{"ok": false, "error": {"code": "busy", "message": ..., "retry_after": 0.4}}``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import orjson

from shared.core import errors
from shared.core.lifecycle import IllegalTransition

MAX_MESSAGE = 1024


class ErrorCode(StrEnum):
    """Every error code an API reply can carry."""

    BAD_REQUEST = "bad_request"
    """The body is not JSON/msgpack or not the schema's shape (wrong type, unknown field)."""
    INVALID = "invalid"
    """A value breaks a documented limit; the message names the field and the limit."""
    CONFLICT = "conflict"
    """The idempotency key is bound to a different request body."""
    NOT_FOUND = "not_found"
    """No such job or dead letter, or an asset chunk a manifest names is not stored."""
    ILLEGAL_STATE = "illegal_state"
    """The job's state does not allow this (for example retrying a completed job)."""
    UNAVAILABLE = "unavailable"
    """A backing server did not answer; try again later."""
    BUSY = "busy"
    """The gateway's intake is full; nothing was done: send the request again after
    ``retry_after`` seconds (see :mod:`services.gateway.intake`)."""
    INTERNAL = "internal"
    """A bug; the gateway logged the details."""


_BY_EXCEPTION: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (IllegalTransition, ErrorCode.ILLEGAL_STATE),
    (errors.DecodeError, ErrorCode.BAD_REQUEST),
    (errors.ValidationError, ErrorCode.INVALID),
    (errors.ConflictError, ErrorCode.CONFLICT),
    (errors.NotFoundError, ErrorCode.NOT_FOUND),
    (errors.RetryableError, ErrorCode.UNAVAILABLE),
)


def error_code_for(exc: BaseException) -> ErrorCode:
    """The reply code for an exception (by class, never by message)."""
    for cls, code in _BY_EXCEPTION:
        if isinstance(exc, cls):
            return code
    return ErrorCode.INTERNAL


def ok_reply(**fields: Any) -> bytes:
    """``{"ok": true, **fields}`` as JSON."""
    if "ok" in fields or "error" in fields:
        raise ValueError("'ok' and 'error' are reserved reply fields")
    return orjson.dumps({"ok": True, **fields}, option=orjson.OPT_NON_STR_KEYS)


def error_reply(code: ErrorCode, message: str, *, retry_after: float | None = None) -> bytes:
    """``{"ok": false, "error": {"code": code, "message": message}}`` as JSON.

    ``retry_after`` (seconds) is added to the error when given (``busy`` replies).
    """
    body: dict[str, Any] = {"code": ErrorCode(code).value, "message": message[:MAX_MESSAGE]}
    if retry_after is not None:
        body["retry_after"] = retry_after
    return orjson.dumps({"ok": False, "error": body})


def reply_for_exception(exc: BaseException) -> bytes:
    """An error reply for ``exc``; internal errors do not leak their message."""
    code = error_code_for(exc)
    message = "internal error" if code is ErrorCode.INTERNAL else str(exc)
    return error_reply(code, message)


class ApiError(errors.TesseraError):
    """An error reply, raised on the client side by :func:`decode_reply`."""

    def __init__(self, code: ErrorCode, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code.value
        self.error_code, self.message = code, message
        #: seconds the gateway asked to wait before trying again (``busy``), else None
        self.retry_after = retry_after


def decode_reply(data: bytes) -> dict[str, Any]:
    """The fields of an ok reply; raise :class:`ApiError` for an error reply."""
    try:
        body = orjson.loads(data)
        ok = body["ok"]
    except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
        raise errors.DecodeError(f"reply: not a Tessera reply ({type(exc).__name__})") from exc
    if ok is True:
        return {k: v for k, v in body.items() if k != "ok"}
    try:
        code, message = ErrorCode(body["error"]["code"]), str(body["error"]["message"])
        hint = body["error"].get("retry_after")
        retry_after = None if hint is None else max(0.0, float(hint))
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.DecodeError(f"reply: malformed error ({type(exc).__name__})") from exc
    raise ApiError(code, message, retry_after=retry_after)
