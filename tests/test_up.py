"""``tessera up``: prints usable endpoints, runs the services, restarts what dies (within a
bound), and Ctrl-C leaves nothing behind. Every test runs ``tessera up`` as a real process."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from services.cli import main as cli_main
from services.cli.local import run_demo
from tests.helpers import eventually_sync, pid_alive

#: a tile that takes long enough to be caught mid-render (about 2 s on one core, 4 tiles: a
#: status poll, a CLI process taking about a second on a loaded box, finds the job in flight),
#: checkpointed every half second
SLOW_JOB = ["--width", "32", "--height", "32", "--spp", "8000", "--tile", "16"]
QUICK_JOB = ["--width", "32", "--height", "32", "--spp", "4", "--tile", "16"]


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


class Up:
    """A running ``tessera up`` (stdout: the export lines; stderr to a file) and what it said."""

    def __init__(self, data_dir: Path, args: list[str], env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.pid_file = data_dir / "pids.json"
        self.err_path = data_dir.parent / f"{data_dir.name}.up-stderr"
        self._err: IO[str] = self.err_path.open("w")
        argv = [sys.executable, "-m", "services.cli", "up", "--data-dir", str(data_dir), *args]
        self.popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._err, text=True, env=os.environ | env
        )
        #: every child PID this test has seen; all must be gone at the end
        self.seen: set[int] = set()
        self.env: dict[str, str] = {}

    def read_exports(self) -> dict[str, str]:
        """The ``export`` lines (printed once everything started), as the clients' environment."""
        assert self.popen.stdout is not None
        for _ in range(4):  # NATS, PostgreSQL, the object store, the web console's token
            line = self.popen.stdout.readline()
            assert line.startswith("export "), (line, self.stderr())
            name, _, value = shlex.split(line)[1].partition("=")
            self.env[name] = value
        return self.env

    def stderr(self) -> str:
        return self.err_path.read_text()

    def children(self) -> dict[str, Any]:
        """``pids.json``: name -> {pid, restarts, log}; {} before it is written."""
        try:
            state = json.loads(self.pid_file.read_text())
        except FileNotFoundError:
            return {}
        self.seen |= {c["pid"] for c in state["children"].values() if c["pid"] is not None}
        return dict(state["children"])

    def running(self) -> dict[str, Any]:
        """:meth:`children` once every child has a live PID ({} before)."""
        kids = self.children()
        return kids if kids and all(c["pid"] and pid_alive(c["pid"]) for c in kids.values()) else {}

    def restarted(self, name: str, old_pid: int, restarts: int) -> dict[str, Any]:
        """Wait (bounded) until ``name`` runs again: a new PID, ``restarts`` restarts."""

        def again() -> dict[str, Any]:
            if self.popen.poll() is not None:
                raise AssertionError(f"tessera up exited instead:\n{self.stderr()}")
            child = self.children().get(name, {})
            new = child.get("pid")
            ok = new not in (None, old_pid) and child["restarts"] == restarts and pid_alive(new)
            return child if ok else {}

        return eventually_sync(again, timeout=60, what=f"{name} restarted")

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run a ``tessera`` client command against this stack."""
        argv = [sys.executable, "-m", "services.cli", *args]
        env = os.environ | self.env
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)

    def interrupt(self) -> int:
        """Ctrl-C; the exit status."""
        self.popen.send_signal(signal.SIGINT)
        return self.popen.wait(timeout=60)

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._err.close()
        self.err_path.unlink(
            missing_ok=True
        )  # (beside the data directory, which the fixture removes)
        eventually_sync(
            lambda: not any(pid_alive(p) for p in self.seen), timeout=15, what="all children gone"
        )


@contextmanager
def running_up(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Up]:
    up = Up(data_dir, list(args), env or {})
    try:
        yield up
    finally:
        up.close()


def _job_id(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout.split()[0]


@pytest.mark.timeout(300)
def test_a_killed_worker_is_restarted_and_the_next_job_completes(server_dir: Path) -> None:
    with running_up(server_dir) as up:
        up.read_exports()
        kids = eventually_sync(up.running, timeout=60, what="every child has a live PID")
        assert set(kids) == {"nats-server n1", "postgres", "gateway", "scheduler", "finalizer",
                             "worker-1", "web"}  # fmt: skip
        assert all(c["restarts"] == 0 for c in kids.values())
        old = kids["worker-1"]["pid"]
        os.kill(old, signal.SIGKILL)

        new = up.restarted("worker-1", old, restarts=1)["pid"]
        err = up.stderr()
        assert "worker-1 exited unexpectedly (signal SIGKILL); restart 1 in" in err, err
        assert f"worker-1 restarted as PID {new} (restart 1)" in err, err

        job = _job_id(up.cli("submit", "cornell", *QUICK_JOB))
        watched = up.cli("watch", job, "--interval", "0.2")
        assert watched.returncode == 0, (watched.stderr, up.stderr())
        assert up.children()["gateway"]["restarts"] == 0
        # the web console answers with the token up printed (its port is on stderr)
        url = re.search(r"# web console: (http://\S+/)", up.stderr())
        assert url, up.stderr()
        token = up.env["TESSERA_WEB_TOKEN"].removeprefix("operator:")
        request = urllib.request.Request(
            f"{url.group(1)}api/jobs/{job}", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["state"] == "completed"

        assert up.interrupt() == 0
        assert "restarts: nats-server n1 0, postgres 0, gateway 0, scheduler 0, finalizer 0, " \
               "worker-1 1" in up.stderr()  # fmt: skip
        assert not up.pid_file.exists(), "stale PIDs are not left in pids.json"
        assert old in up.seen and new in up.seen


@pytest.mark.timeout(300)
def test_a_killed_nats_server_comes_back_on_its_port_and_the_job_in_flight_completes(
    server_dir: Path,
) -> None:
    with running_up(server_dir, env={"TESSERA_CHECKPOINT_INTERVAL": "0.5"}) as up:
        port = up.read_exports()["TESSERA_NATS_URL"].rsplit(":", 1)[1]
        old = eventually_sync(up.running, timeout=60, what="all running")["nats-server n1"]["pid"]
        old_argv = psutil.Process(old).cmdline()
        job = _job_id(up.cli("submit", "cornell", *SLOW_JOB))

        def in_flight() -> bool:
            done = up.cli("status", job, "--json", timeout=60)
            status = json.loads(done.stdout) if done.returncode == 0 else {}
            return status.get("state") == "progressing" and status["samples_done"] > 0

        eventually_sync(in_flight, timeout=120, interval=0.2, what="a tile checkpointed")
        os.kill(old, signal.SIGKILL)

        new = up.restarted("nats-server n1", old, restarts=1)["pid"]
        new_argv = psutil.Process(new).cmdline()
        assert new_argv == old_argv  # same port, monitor port and JetStream store directory
        assert new_argv[new_argv.index("-p") + 1] == port
        assert "nats-server n1 exited unexpectedly (signal SIGKILL)" in up.stderr()

        watched = up.cli("watch", job, "--interval", "0.5")
        assert watched.returncode == 0, (watched.stderr, up.stderr())
        assert all(c["restarts"] == 0 for n, c in up.children().items() if n != "nats-server n1")
        assert up.interrupt() == 0


def test_a_configuration_error_stops_up_at_once_without_restarts(server_dir: Path) -> None:
    """A bad setting makes every service exit 2 at start: restarting cannot help, up gives up
    at the first such exit and exits 2 (a configuration error)."""
    env = {"TESSERA_LEASE_TTL": "soon"}
    with running_up(server_dir, "--max-restarts", "2", env=env) as up:
        up.read_exports()
        assert up.popen.wait(timeout=90) == 2
        err = up.stderr()
        up.seen |= {int(p) for p in re.findall(r"PID (\d+)", err)}
        gave_up = re.search(
            r"(gateway|scheduler|finalizer|worker-1|web) exited with a configuration error \(exit "
            r"code 2\): restarting cannot help; giving up and stopping everything", err
        )  # fmt: skip
        assert gave_up, err
        assert "TESSERA_LEASE_TTL" in err.split("giving up", 1)[1], "its log tail shows why"
        assert "exited unexpectedly" not in err and "restarted as PID" not in err, err
        restarts = err.rsplit("restarts: ", 1)[1]
        assert f"{gave_up[1]} 0" in restarts and " 1" not in restarts, restarts
        assert not up.pid_file.exists()
    assert len(up.seen) == 7, "only the first start of each child"


def test_with_auth_a_configuration_error_of_the_first_service_exits_2(server_dir: Path) -> None:
    """--auth starts the scheduler alone first: its exit 2 ends `up` before supervision."""
    env = {"TESSERA_LEASE_TTL": "soon"}
    with running_up(server_dir, "--auth", env=env) as up:
        assert up.popen.wait(timeout=90) == 2
        err = up.stderr()
        assert "scheduler did not start" in err and "TESSERA_LEASE_TTL" in err, err
        assert not up.pid_file.exists()
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if str(server_dir) in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert not left, "no server of this stack is left"


@pytest.mark.timeout(300)
def test_a_worker_that_keeps_crashing_is_restarted_up_to_the_limit_then_up_gives_up(
    server_dir: Path,
) -> None:
    """Every worker start SIGKILLs itself at its first tile: restarted twice, then up gives up."""
    env = {"TESSERA_CRASH_AT": "worker.before_lease"}
    with running_up(server_dir, "--max-restarts", "2", env=env) as up:
        up.read_exports()
        eventually_sync(up.running, timeout=60, what="every child has a live PID")
        job = _job_id(up.cli("submit", "cornell", *QUICK_JOB))  # 4 tiles: one per worker start
        assert up.popen.wait(timeout=120) == 1
        err = up.stderr()
        up.seen |= {int(p) for p in re.findall(r"PID (\d+)", err)}
        for n in (1, 2):
            assert f"worker-1 exited unexpectedly (signal SIGKILL); restart {n} in" in err, err
            assert re.search(rf"worker-1 restarted as PID \d+ \(restart {n}\)", err), err
        assert "restart 3 in" not in err
        assert re.search(
            r"worker-1 failed 3 times within 60 s \(last: signal SIGKILL; at most 2 restarts "
            r"allowed\); giving up and stopping everything", err
        ), err  # fmt: skip
        crashed = "crash point worker.before_lease reached; SIGKILL"
        assert crashed in err.split("giving up", 1)[1], "its log tail shows why"
        log = (server_dir / "logs" / "worker-1.log").read_text()
        assert log.count(crashed) == 3, "every restarted worker re-armed the crash point"
        assert "configuration error" not in err
        assert "restarts: nats-server n1 0, postgres 0, gateway 0, scheduler 0, finalizer 0, " \
               "worker-1 2" in err  # fmt: skip
        assert not up.pid_file.exists()
    assert len(up.seen) == 7 + 2  # servers, services, web; two restarts
    # Nothing was lost: `up` again on the same data (no crash point) completes the job.
    with running_up(server_dir) as again:
        again.read_exports()
        watched = again.cli("watch", job, "--interval", "0.5")
        assert watched.returncode == 0, (watched.stdout, watched.stderr, again.stderr())
        assert again.interrupt() == 0


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--max-restarts", "-1"], "must be at least 0"),
        (["--max-restarts", "many"], "is not a whole number"),
        (["--restart-window", "0"], "must be a finite number > 0"),
    ],
)
def test_up_refuses_bad_restart_limits_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], why: str
) -> None:
    data = tmp_path / "data"
    with pytest.raises(SystemExit) as exited:
        cli_main(["up", "--data-dir", str(data), *args])
    assert exited.value.code == 2
    assert why in capsys.readouterr().err
    assert not data.exists(), "no server was started"
