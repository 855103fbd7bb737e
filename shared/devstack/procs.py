"""Child processes that cannot outlive us: one process group each, killed by PID.

Every server and service Tessera starts locally goes through :class:`ManagedProcess`: it runs in
its own session (so the whole group can be signalled), asks the kernel to kill it when its parent
dies (``PR_SET_PDEATHSIG``, so a SIGKILLed supervisor leaves nothing behind), writes its output
to a log file, and is stopped by PID with a bounded SIGTERM → SIGKILL escalation.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["ManagedProcess", "StackError", "free_port", "port_accepts", "wait_for"]

_PR_SET_PDEATHSIG = 1
#: how much of a log's end :meth:`ManagedProcess.log_tail` reads
LOG_TAIL_BYTES = 64 * 1024


class StackError(RuntimeError):
    """A local server could not be started, or did not become ready in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _parent_death_guard(sig: int) -> Callable[[], None]:
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def guard() -> None:
        # Runs in the child between fork and exec, after any setuid (which would clear it).
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the guard was armed
            os._exit(1)

    return guard


class ManagedProcess:
    """One child process with a log file, its own process group and a parent-death guard."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        user: str | None = None,
        death_signal: int = signal.SIGKILL,
        stop_signal: int = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.user = user
        self.death_signal = death_signal
        self.stop_signal = stop_signal
        self._popen: subprocess.Popen[bytes] | None = None
        #: where this run's output starts in the log (the file is appended to across runs)
        self.log_start = 0

    @property
    def pid(self) -> int | None:
        """The PID of the running child, or None."""
        return self._popen.pid if self._popen is not None else None

    def alive(self) -> bool:
        """True while the child runs (a zombie is reaped and counts as dead)."""
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> None:
        """Start the child; its stdout and stderr are appended to the log file."""
        if self.alive():
            raise StackError(f"{self.name} is already running as PID {self.pid}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.log_start = log.seek(0, os.SEEK_END)
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    user=self.user,
                    start_new_session=True,
                    preexec_fn=_parent_death_guard(self.death_signal),
                )
            except OSError as exc:
                raise StackError(f"could not start {self.name} ({self.argv[0]}): {exc}") from exc

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (no-op when it is not running)."""
        if self._popen is not None and self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group and reap the child."""
        self.signal(signal.SIGKILL)
        if self._popen is not None:
            self._popen.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask politely, wait at most ``timeout`` seconds, then SIGKILL."""
        if self._popen is None:
            return
        self.signal(self.stop_signal)
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        # Children that outlived the leader (same group) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the child to exit; its return code, or None on timeout."""
        if self._popen is None:
            return None
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines this run wrote to the log, for error messages.

        Reads at most the last :data:`LOG_TAIL_BYTES` of the file, however long it has grown.
        """
        try:
            with self.log_path.open("rb") as log:
                end = log.seek(0, os.SEEK_END)
                log.seek(max(self.log_start, end - LOG_TAIL_BYTES))
                text = log.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def log_since_start(self) -> str:
        """What this run has written to the log so far (not earlier runs' lines)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.log_start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""


def wait_for(
    ready: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    proc: ManagedProcess | None = None,
    interval: float = 0.05,
) -> None:
    """Poll ``ready`` until it is true, for at most ``timeout`` seconds.

    Raises :class:`StackError` "<what> within <timeout> s; its log: ..." on time-out, or at once
    if ``proc`` exits meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and not proc.alive():
            raise StackError(
                f"{what} within {timeout:g} s: it exited with code {proc.wait(0)}; "
                f"its log ({proc.log_path}):\n{proc.log_tail()}"
            )
        if ready():
            return
        if time.monotonic() >= deadline:
            log = f"; its log ({proc.log_path}):\n{proc.log_tail()}" if proc else ""
            raise StackError(f"{what} within {timeout:g} s{log}")
        time.sleep(interval)
