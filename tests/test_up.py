"""``tessera up``: prints usable endpoints, runs the services, and Ctrl-C leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from services.local import run_demo
from tests.helpers import eventually_sync, pid_alive


def _children(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


def test_ctrl_c_stops_the_stack_and_the_services(server_dir: Path) -> None:
    up = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up", "--data-dir", str(server_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert up.stdout is not None
        lines = [up.stdout.readline() for _ in range(3)]
        assert [line.split("=")[0] for line in lines] == [
            "export TESSERA_NATS_URL",
            "export TESSERA_DATABASE_URL",
            "export TESSERA_OBJECT_STORE",
        ]

        def everything_running() -> list[int]:
            kids = _children(up.pid)
            names = " ".join(" ".join(psutil.Process(k).cmdline()) for k in kids)
            wanted = ("nats-server", "postgres", *(f"services.{s}" for s in
                      ("gateway", "scheduler", "worker", "finalizer")))  # fmt: skip
            return kids if all(w in names for w in wanted) else []

        kids = eventually_sync(everything_running, timeout=60, what="stack and services run")
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        for stream in (up.stdout, up.stderr):
            if stream is not None:
                stream.close()
    eventually_sync(lambda: not any(pid_alive(k) for k in kids), timeout=10, what="all gone")


def test_demo_refuses_bad_arguments_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    cases = [
        (64, tmp_path / "missing" / "demo.png", "is not a writable directory"),
        (0, tmp_path / "demo.png", "spp"),
        (10**9, tmp_path / "demo.png", "spp"),
    ]
    for spp, out, why in cases:
        assert run_demo(data, s3=False, out=out, spp=spp) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err, err
        assert not data.exists(), "no server was started"
        assert not out.exists()
