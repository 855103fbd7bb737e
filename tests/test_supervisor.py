"""The supervisor of ``tessera up`` on real (tiny) processes: backoff, window, giving up."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shared.core.retry import RetryPolicy
from shared.devstack.procs import ManagedProcess, wait_for
from shared.devstack.supervisor import Child, RestartLimits, Supervisor
from tests.helpers import pid_alive

FAST = RetryPolicy(base=0.01, cap=1.0, jitter=0.0)


def _supervise(child: Child, limits: RestartLimits, *, stop_at: str | None = None) -> list[str]:
    """Run a supervisor over ``child`` until it gives up or logs ``stop_at``; its log lines."""
    lines: list[str] = []
    stop = threading.Event()

    def log(text: str) -> None:
        lines.append(text)
        if stop_at is not None and stop_at in text:
            stop.set()

    supervisor = Supervisor([child], limits, poll=0.01, log=log)
    try:
        status = supervisor.run(stop)
    finally:
        child.proc.stop(timeout=2)
    assert status == (0 if stop_at else 1), lines
    return lines


def test_a_crash_loop_backs_off_exponentially_then_gives_up(tmp_path: Path) -> None:
    proc = ManagedProcess("crasher", ["sh", "-c", "echo boom; exit 3"], tmp_path / "c.log")
    proc.start()
    child = Child(proc, proc.start)
    lines = _supervise(child, RestartLimits(max_restarts=3, window=600, backoff=FAST))
    assert [line.split("; ")[1].split(" (")[0] for line in lines[:-1:2]] == [
        "restart 1 in 0.01 s",
        "restart 2 in 0.02 s",
        "restart 3 in 0.04 s",
    ]
    assert all("exited unexpectedly (exit code 3)" in line for line in lines[:-1:2])
    assert lines[-1].startswith(
        "crasher failed 4 times within 600 s (last: exit code 3; at most 3 restarts allowed); "
        "giving up and stopping everything; its log"
    )
    assert lines[-1].endswith("\nboom"), "the log tail says why"
    assert child.restarts == 3


def test_failures_further_apart_than_the_window_never_add_up(tmp_path: Path) -> None:
    # Each run lives longer than the window, so every failure is the first within it.
    proc = ManagedProcess("flaky", ["sh", "-c", "sleep 0.3; exit 1"], tmp_path / "f.log")
    proc.start()
    child = Child(proc, proc.start)
    limits = RestartLimits(max_restarts=1, window=0.2, backoff=FAST)
    lines = _supervise(child, limits, stop_at="(restart 3)")
    assert child.restarts == 3
    failures = [line for line in lines if "exited unexpectedly" in line]
    assert len(failures) == 3 and all("(failure 1 within 0.2 s" in f for f in failures), lines


def test_a_restart_that_never_becomes_ready_counts_as_a_failure(tmp_path: Path) -> None:
    proc = ManagedProcess("stuck", ["sleep", "30"], tmp_path / "s.log")
    pids: list[int] = []

    def start() -> None:
        proc.start()
        assert proc.pid is not None
        pids.append(proc.pid)
        wait_for(lambda: False, timeout=0.05, what="stuck did not answer", proc=proc)

    child = Child(proc, start)  # never started: the first poll sees it down
    lines = _supervise(child, RestartLimits(max_restarts=2, window=600, backoff=FAST))
    assert [line for line in lines if "failed: stuck did not answer within 0.05 s" in line]
    assert len(pids) == 2 and not any(pid_alive(p) for p in pids), "each attempt was stopped"
    assert "stuck failed 3 times" in lines[-1]


def test_the_pid_file_names_every_child(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", ["sleep", "30"], tmp_path / "s.log")
    proc.start()
    try:
        supervisor = Supervisor([Child(proc, proc.start)], RestartLimits(), pid_file=tmp_path / "p")
        supervisor.write_pid_file()
        text = (tmp_path / "p").read_text()
        assert f'"pid": {proc.pid}' in text and '"restarts": 0' in text
        assert f'"log": "{tmp_path / "s.log"}"' in text
        supervisor.remove_pid_file()
        assert not (tmp_path / "p").exists()
    finally:
        proc.stop(timeout=2)


def test_a_final_exit_code_gives_up_at_once_with_that_code(tmp_path: Path) -> None:
    proc = ManagedProcess("svc", ["sh", "-c", "echo 'bad TESSERA_X'; exit 2"], tmp_path / "v.log")
    proc.start()
    child = Child(proc, proc.start, final_exits={2: "configuration error"})
    lines: list[str] = []
    supervisor = Supervisor([child], RestartLimits(backoff=FAST), poll=0.01, log=lines.append)
    try:
        assert supervisor.run(threading.Event()) == 2, lines
    finally:
        proc.stop(timeout=2)
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "svc exited with a configuration error (exit code 2): restarting cannot help; giving up "
        "and stopping everything; its log"
    )
    assert lines[0].endswith("\nbad TESSERA_X"), "the log tail says why"
    assert child.restarts == 0


def test_an_exit_code_that_is_final_for_another_child_is_restarted(tmp_path: Path) -> None:
    # A server's exit 2 means something else: without final_exits it is an ordinary failure.
    proc = ManagedProcess("server", ["sh", "-c", "exit 2"], tmp_path / "s.log")
    proc.start()
    child = Child(proc, proc.start)
    lines = _supervise(child, RestartLimits(max_restarts=2, window=600, backoff=FAST))
    assert child.restarts == 2
    assert "server exited unexpectedly (exit code 2); restart 1 in" in lines[0]
    assert "server failed 3 times within 600 s (last: exit code 2;" in lines[-1]
    assert not any("configuration error" in line for line in lines)


def test_only_other_exit_codes_of_a_child_with_final_exits_are_restarted(tmp_path: Path) -> None:
    proc = ManagedProcess("svc", ["sh", "-c", "exit 1"], tmp_path / "v.log")
    proc.start()
    child = Child(proc, proc.start, final_exits={2: "configuration error"})
    lines = _supervise(child, RestartLimits(max_restarts=1, window=600, backoff=FAST))
    assert child.restarts == 1 and "svc failed 2 times" in lines[-1], lines


def test_exit_code_0_cannot_be_final(tmp_path: Path) -> None:
    proc = ManagedProcess("svc", ["true"], tmp_path / "v.log")
    with pytest.raises(ValueError, match="exit code 0 cannot be final"):
        Child(proc, proc.start, final_exits={0: "stopped"})
