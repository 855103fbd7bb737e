"""Renderer child processes that never outlive the worker, and the failures they report.

Every Blender or POV-Ray process runs in its own session (so its whole process group can be
killed by PID, with whatever it spawned) and asks the kernel to SIGKILL it when the worker dies
(``PR_SET_PDEATHSIG``), so a SIGKILLed worker leaves no renderer behind. Its stderr is drained
into a bounded tail that goes with the failure it explains (its ``detail``: stored with the
attempt, in ``attempts.error`` after the message, and in the dead letter's ``error``)::

    RetryableError
    ├── RendererCrashed   the process died by a signal (or once with a non-zero exit)
    └── RendererTimeout   a pass exceeded the watchdog; the process group was killed
    TerminalError
    └── RendererFailed    the scene does not parse, or a non-zero exit recurred on the same input
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from shared.core.errors import RetryableError, TerminalError

__all__ = [
    "STDERR_TAIL_BYTES",
    "RendererCrashed",
    "RendererFailed",
    "RendererTimeout",
    "StderrTail",
    "kill_group",
    "spawn",
]

#: how much of a renderer's stderr goes with a failure (and is stored with the attempt)
STDERR_TAIL_BYTES = 4096
_PR_SET_PDEATHSIG = 1


class RendererFailed(TerminalError):
    """The renderer rejected the input for good: retrying the same scene cannot help.

    ``message`` is the renderer's own words; ``stderr_tail`` the last bytes it wrote.
    """

    code = "renderer_failed"

    def __init__(self, message: str, *, renderer: str, stderr_tail: str = "") -> None:
        super().__init__(f"{renderer}: {message}")
        self.renderer = renderer
        # kept with the attempt and the dead letter (TesseraError.detail), bounded
        self.stderr_tail = self.detail = stderr_tail[-STDERR_TAIL_BYTES:]


class RendererCrashed(RetryableError):
    """The renderer process died (by a signal, or a first non-zero exit): try again."""

    code = "renderer_crashed"

    def __init__(
        self, message: str, *, renderer: str, stderr_tail: str = "", signalled: bool = False
    ) -> None:
        super().__init__(f"{renderer}: {message}")
        self.renderer = renderer
        # kept with the attempt and the dead letter (TesseraError.detail), bounded
        self.stderr_tail = self.detail = stderr_tail[-STDERR_TAIL_BYTES:]
        #: True when a signal killed it (retryable for good), False for a first non-zero exit
        self.signalled = signalled


class RendererTimeout(RetryableError):
    """A pass ran longer than the watchdog allows; its process group has been killed."""

    code = "renderer_timeout"

    def __init__(self, message: str, *, renderer: str, stderr_tail: str = "") -> None:
        super().__init__(f"{renderer}: {message}")
        self.renderer = renderer
        # kept with the attempt and the dead letter (TesseraError.detail), bounded
        self.stderr_tail = self.detail = stderr_tail[-STDERR_TAIL_BYTES:]


def _death_guard() -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def guard() -> None:
        # In the child between fork and exec.
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the worker died before the guard was armed
            os._exit(1)

    return guard


async def spawn(
    argv: Sequence[str],
    *,
    cwd: Path,
    stdin: bool = False,
    stdout: bool = False,
    env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session with the parent-death guard; stderr is always a pipe.
    ``env`` replaces the environment (``None``: this process's).

    Raises :class:`RendererFailed` when the binary cannot be started (missing from PATH).
    """
    pipe, null = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=pipe if stdin else null,
            stdout=pipe if stdout else null,
            stderr=pipe,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=_death_guard(),
        )
    except OSError as exc:
        raise RendererFailed(f"cannot start {argv[0]}: {exc}", renderer=Path(argv[0]).name) from exc


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL ``proc``'s whole process group (it is its session leader); no-op once reaped."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class StderrTail:
    """The last :data:`STDERR_TAIL_BYTES` a process wrote to stderr, drained by a task."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self._buf = bytearray()
        self.task = asyncio.create_task(self._drain(stream))

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._buf += chunk
            del self._buf[:-STDERR_TAIL_BYTES]

    def text(self) -> str:
        """The tail so far, decoded leniently."""
        return self._buf.decode(errors="replace")

    async def finish(self) -> str:
        """Wait (bounded) for the stream to close, then return the tail."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), 2.0)
        return self.text()
