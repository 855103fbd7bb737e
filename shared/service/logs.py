"""Structured logs: one JSON object per line (orjson), or readable text on a terminal.

Call sites pass context as keyword fields — ``log.info("lease acquired", job_id=..., tile=...)``
— and every line carries the process's ``node`` and ``service``. Fields that matter across the
system: ``job_id``, ``tile``, ``attempt_id``, ``idempotency_key``, ``node``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import orjson

__all__ = ["Log", "setup_logging"]


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        body.update(getattr(record, "fields", {}))
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(body, default=str).decode()


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {})
        extra = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("node", "service"))
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()} {extra}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line.rstrip()


def setup_logging(level: str, *, stream: TextIO | None = None, json: bool | None = None) -> None:
    """Configure the root logger once per process: JSON unless ``stream`` is a terminal."""
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    use_json = (not out.isatty()) if json is None else json
    handler.setFormatter(_JsonFormatter() if use_json else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class Log:
    """A logger bound to context fields (``node``, ``service``, ``job_id`` ...)."""

    def __init__(self, name: str, **fields: Any) -> None:
        self._logger = logging.getLogger(name)
        self._fields = fields

    def bind(self, **fields: Any) -> Log:
        """A logger with more context fields."""
        child = Log(self._logger.name)
        child._fields = self._fields | fields
        return child

    def _log(self, level: int, msg: str, exc: bool, fields: dict[str, Any]) -> None:
        logger = self._logger
        if logger.isEnabledFor(level):
            # A record made here, not by Logger.log: no line prints the caller's file and
            # line, and finding them walks the stack (13 of a line's 34 us; a worker logs a
            # line per tile).
            record = logger.makeRecord(logger.name, level, "", 0, msg, (),
                                       sys.exc_info() if exc else None,
                                       extra={"fields": self._fields | fields})  # fmt: skip
            logger.handle(record)

    def debug(self, msg: str, **fields: Any) -> None:
        """Log at DEBUG with fields."""
        self._log(logging.DEBUG, msg, False, fields)

    def info(self, msg: str, **fields: Any) -> None:
        """Log at INFO with fields."""
        self._log(logging.INFO, msg, False, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        """Log at WARNING with fields."""
        self._log(logging.WARNING, msg, False, fields)

    def error(self, msg: str, *, exc: bool = False, **fields: Any) -> None:
        """Log at ERROR with fields (and the current exception's traceback if ``exc``)."""
        self._log(logging.ERROR, msg, exc, fields)
