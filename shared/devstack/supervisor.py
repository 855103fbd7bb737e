"""Keep a set of child processes running: restart what dies, with bounded backoff.

``tessera up`` hands every server and service it started to a :class:`Supervisor`. Polling
:meth:`ManagedProcess.alive`, it notices a child that exited without being asked to, logs it,
and starts it again after ``backoff(limits.backoff, n)`` seconds, ``n`` being the number of
times that child failed within the last ``limits.window`` seconds (so a child that crashes once a
day comes back after the base delay, one that crash-loops waits longer each time). When a child
fails more than ``limits.max_restarts`` times within the window the supervisor gives up: it
reports which child and why (its exit status and log tail) and returns 1; the caller stops
everything. A restart that does not come up (its readiness check fails) counts as a failure too.
An exit code listed in the child's ``final_exits`` (a service's 2: a configuration error) is one
restarting cannot fix: the supervisor gives up at its first occurrence and returns that code.

While it runs, ``pid_file`` (JSON) names every child's current PID, restart count and log, so
scripts and tests can find a process without scraping output.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shared.core.retry import RetryPolicy, backoff
from shared.devstack.procs import ManagedProcess, StackError

__all__ = ["RESTART_BACKOFF", "Child", "RestartLimits", "Supervisor", "exit_status"]


#: 0.5 s, 1 s, 2 s ... at most 10 s before a restart
RESTART_BACKOFF = RetryPolicy(base=0.5, cap=10.0, jitter=0.2)


@dataclass(frozen=True)
class RestartLimits:
    """How often a child may be restarted before the supervisor gives up."""

    #: restarts allowed within ``window``; one more failure stops everything (0: never restart)
    max_restarts: int = 5
    #: seconds over which failures are counted
    window: float = 60.0
    #: delay before a restart, by the number of failures within the window
    backoff: RetryPolicy = field(default_factory=lambda: RESTART_BACKOFF)

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window <= 0:
            raise ValueError(f"invalid restart limits {self}")


@dataclass
class Child:
    """One supervised process; ``start`` starts it again and waits (bounded) until it is ready."""

    proc: ManagedProcess
    start: Callable[[], None]
    restarts: int = 0
    failures: deque[float] = field(default_factory=deque)  # monotonic times, within the window
    due: float | None = None  # when the pending restart is due (None: none pending)
    #: exit codes restarting cannot fix, with what they mean: the supervisor gives up at once
    #: and :meth:`Supervisor.run` returns the code ({2: "configuration error"} for a service)
    final_exits: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if any(code == 0 for code in self.final_exits):
            raise ValueError("exit code 0 cannot be final: run() returns 0 only when stopped")

    @property
    def name(self) -> str:
        return self.proc.name


def exit_status(code: int | None) -> str:
    """``exit code 3`` or ``signal SIGKILL`` for a Popen return code."""
    if code is None:
        return "unknown exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Restart dead children with bounded backoff until stopped or one keeps failing."""

    def __init__(
        self,
        children: Sequence[Child],
        limits: RestartLimits,
        *,
        pid_file: Path | None = None,
        poll: float = 0.2,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.children = list(children)
        self.limits = limits
        self.pid_file = pid_file
        self.poll = poll
        self._log = log or (lambda text: print(f"tessera up: {text}", file=sys.stderr, flush=True))

    def run(self, stop: threading.Event) -> int:
        """Supervise until ``stop`` is set (0), a child exceeds the restart limits (1) or exits
        with one of its ``final_exits`` (that exit code)."""
        self.write_pid_file()
        while not stop.wait(self._next_wait()):
            for child in self.children:
                if stop.is_set():
                    return 0
                if status := self._tend(child):
                    return status
        return 0

    def _next_wait(self) -> float:
        now = time.monotonic()
        dues = [c.due - now for c in self.children if c.due is not None]
        return max(0.0, min([self.poll, *dues]))

    def _tend(self, child: Child) -> int:
        """Notice a death or carry out a due restart; 0, or the exit status when giving up."""
        now = time.monotonic()
        if child.due is None:
            return 0 if child.proc.alive() else self._failed(child, now, child.proc.wait(0))
        if now >= child.due:
            child.due = None
            self._restart(child)
        return 0

    def _failed(self, child: Child, now: float, code: int | None) -> int:
        # Whatever the dead leader left in its process group (PostgreSQL backends) must go
        # before a new one starts on the same port and data directory.
        child.proc.stop(timeout=5)
        why = exit_status(code)
        if code is not None and code in child.final_exits:
            self._log(
                f"{child.name} exited with a {child.final_exits[code]} ({why}): restarting "
                f"cannot help; giving up and stopping everything; its log "
                f"({child.proc.log_path}):\n{child.proc.log_tail()}"
            )
            return code
        child.failures.append(now)
        while child.failures and child.failures[0] < now - self.limits.window:
            child.failures.popleft()
        failures = len(child.failures)
        if failures > self.limits.max_restarts:
            self._log(
                f"{child.name} failed {failures} times within {self.limits.window:g} s "
                f"(last: {why}; at most {self.limits.max_restarts} restarts allowed); giving "
                f"up and stopping everything; its log ({child.proc.log_path}):\n"
                f"{child.proc.log_tail()}"
            )
            return 1
        delay = backoff(self.limits.backoff, failures)
        child.due = now + delay
        self._log(
            f"{child.name} exited unexpectedly ({why}); restart {child.restarts + 1} in "
            f"{delay:.2f} s (failure {failures} within {self.limits.window:g} s; "
            f"{self.limits.max_restarts} restarts allowed)"
        )
        return 0

    def _restart(self, child: Child) -> None:
        child.restarts += 1
        try:
            child.start()
        except StackError as exc:
            # Not ready in time, or died while starting: stop what is left; the next poll
            # counts it as a failure and schedules the next attempt.
            child.proc.stop(timeout=5)
            self._log(f"{child.name} restart {child.restarts} failed: {exc}")
        else:
            self._log(f"{child.name} restarted as PID {child.proc.pid} (restart {child.restarts})")
        self.write_pid_file()

    def pids(self) -> dict[str, int | None]:
        """Every child's current PID (None while it is down)."""
        return {c.name: c.proc.pid if c.proc.alive() else None for c in self.children}

    def summary(self) -> str:
        """``gateway 0, worker-1 2, ...``: restarts per child."""
        return ", ".join(f"{c.name} {c.restarts}" for c in self.children)

    def write_pid_file(self) -> None:
        """Atomically rewrite ``pid_file`` (no-op without one)."""
        if self.pid_file is None:
            return
        state = {
            "supervisor": os.getpid(),
            "children": {
                c.name: {"pid": pid, "restarts": c.restarts, "log": str(c.proc.log_path)}
                for c, pid in zip(self.children, self.pids().values(), strict=True)
            },
        }
        tmp = self.pid_file.with_name(f".{self.pid_file.name}.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.pid_file)

    def remove_pid_file(self) -> None:
        """Remove ``pid_file``: its PIDs are stale once the children are stopped."""
        if self.pid_file is not None:
            self.pid_file.unlink(missing_ok=True)
