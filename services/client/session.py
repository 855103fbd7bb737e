"""Settings, connections and the exit-code mapping shared by every client command.

A command is an ``async`` function of a :class:`Session`; :func:`run_command` builds the
settings from the environment, connects, runs it and turns the outcome into the documented exit
status (see :mod:`services.client.commands`), printing ``error[code]: message`` to stderr for an
error reply.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client as NATS

from proto.names import Names
from proto.replies import ApiError, ErrorCode
from services.client.api import RequestTooLarge, TesseraClient
from shared.core.config import Settings
from shared.core.errors import ConfigError, RetryableError, TesseraError
from shared.nats.jetstream import connect_nats

__all__ = [
    "EXIT_API_ERROR",
    "EXIT_JOB_FAILED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "CommandFailed",
    "Session",
    "run_command",
]

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_API_ERROR = 3
EXIT_UNAVAILABLE = 4


class CommandFailed(TesseraError):
    """A command ends with a message and a chosen exit status (a failed job, a bad file ...)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Session:
    """What a command works with: settings, the NATS connection and the API client."""

    settings: Settings
    nc: NATS
    client: TesseraClient

    @property
    def names(self) -> Names:
        """Names of the deployment ``TESSERA_NAMESPACE`` selects."""
        return self.client.names


Command = Callable[[Session], Awaitable[int]]


async def _session_run(settings: Settings, command: Command, request_timeout: float) -> int:
    name = f"tessera-cli:{settings.node}"
    nc = await connect_nats(settings, name=name, connect_within=request_timeout)
    try:
        names = Names(settings.deployment.namespace)
        return await command(
            Session(settings, nc, TesseraClient(nc, names, timeout=request_timeout))
        )
    finally:
        await nc.close()


def exit_status(exc: TesseraError) -> int:
    """The exit status for an error a command let through."""
    if isinstance(exc, CommandFailed):
        return exc.status
    if isinstance(exc, ApiError):
        retry_later = exc.error_code in (ErrorCode.UNAVAILABLE, ErrorCode.BUSY)
        return EXIT_UNAVAILABLE if retry_later else EXIT_API_ERROR
    if isinstance(exc, ConfigError | RequestTooLarge):
        return EXIT_USAGE
    if isinstance(exc, RetryableError):
        return EXIT_UNAVAILABLE
    return EXIT_API_ERROR


def _describe(exc: TesseraError) -> str:
    if isinstance(exc, ApiError):
        return f"error[{exc.code}]: {exc.message}"
    return f"tessera: error: {exc}"


def run_command(command: Command, *, timeout: float) -> int:
    """Run ``command`` on a fresh event loop with settings from the environment."""
    try:
        # clients talk only to the gateways: no database, no object store
        settings = Settings.from_env(os.environ, database=False, object_store=False)
    except ConfigError as exc:
        print(f"tessera: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(_session_run(settings, command, timeout))
    except TesseraError as exc:
        print(_describe(exc), file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:
        return 130
