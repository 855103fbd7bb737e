"""Tessera's one error tree.

Every adapter translates its library's exceptions into these, so a retry decision never
string-matches an exception message::

    TesseraError
    ├── RetryableError        try again later (storage, network, timeouts); may carry retry_after
    │   ├── StoreUnavailable      the metadata store, object store or NATS did not answer
    │   └── LeaseLost             the lease expired or was taken over: stop, commit nothing
    └── TerminalError         retrying cannot help (bad input, deterministic failure)
        ├── DecodeError           a message or request body is not what its schema says
        ├── ValidationError       a request is well-formed but breaks a documented limit
        ├── ConflictError         same idempotency key, different request body
        ├── NotFoundError         the named job, tile or object does not exist
        ├── FencedError           a commit carried a stale fencing token
        └── ConfigError           a setting is missing or malformed (names the variable)
"""

from __future__ import annotations


class TesseraError(Exception):
    """Base of every error Tessera raises on purpose.

    ``code`` is the stable, machine-readable name used in API replies and metrics. ``detail``
    is a longer account kept with the failure where it is recorded (the attempt row, the dead
    letter), bounded by whoever sets it: a renderer's stderr tail (at most 4 KiB).
    """

    code = "internal"
    detail = ""


DETAIL_SEPARATOR = "\n--- detail ---\n"
"""Between an error's message and its :attr:`TesseraError.detail` in :func:`with_detail`."""


def with_detail(exc: BaseException, limit: int = 4000) -> str:
    """``str(exc)`` (at most ``limit`` characters), then its ``detail`` if it has one."""
    message = str(exc)[:limit]
    detail = exc.detail if isinstance(exc, TesseraError) else ""
    return f"{message}{DETAIL_SEPARATOR}{detail}" if detail else message


class RetryableError(TesseraError):
    """The operation may succeed if tried again later.

    ``retry_after`` (seconds) is a hint from the failing side, or ``None``.
    """

    code = "retryable"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreUnavailable(RetryableError):
    """A backing server (Postgres, object store, NATS) was unreachable or timed out."""

    code = "unavailable"


class LeaseLost(RetryableError):
    """Our lease expired or another owner took it: stop work and commit nothing."""

    code = "lease_lost"


class TerminalError(TesseraError):
    """Retrying cannot help; the unit of work is failed or dead-lettered."""

    code = "terminal"


class DecodeError(TerminalError):
    """A message or request body does not match its schema."""

    code = "bad_request"


class ValidationError(TerminalError):
    """A well-formed request breaks a documented limit; the message names field and limit."""

    code = "invalid"


class ConflictError(TerminalError):
    """The idempotency key is already bound to a different request body."""

    code = "conflict"


class NotFoundError(TerminalError):
    """The named job, tile or object does not exist."""

    code = "not_found"


class FencedError(TerminalError):
    """A commit carried a fencing token older than the current owner's."""

    code = "fenced"


class ConfigError(TerminalError):
    """A setting is missing or malformed; the message names the environment variable."""

    code = "config"
