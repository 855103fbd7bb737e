"""The supervisor starts real servers, they work, and stopping leaves no process behind."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import asyncpg
import nats
import pytest

from services.cli.local import ServiceProcesses
from shared.devstack.procs import ManagedProcess, StackError, wait_for
from shared.devstack.stack import NatsServer, SeaweedS3, Stack, _unlink_if_stale
from tests.helpers import eventually_sync, pid_alive


async def test_jetstream_kv_create_and_cas(stack: Stack, namespace: str) -> None:
    nc = await nats.connect(stack.nats.url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=f"{namespace}-kv")
        rev = await kv.create("k", b"v1")
        assert (await kv.get("k")).value == b"v1"
        rev2 = await kv.update("k", b"v2", last=rev)
        assert rev2 > rev
        with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):
            await kv.update("k", b"v3", last=rev)
        await js.delete_key_value(f"{namespace}-kv")
    finally:
        await nc.close()


async def test_postgres_query(stack: Stack) -> None:
    conn = await asyncpg.connect(stack.postgres.dsn)
    try:
        assert await conn.fetchval("SELECT 40 + 2") == 42
    finally:
        await conn.close()


def test_directory_store_is_a_real_directory(stack: Stack) -> None:
    assert stack.env()["TESSERA_OBJECT_STORE"] == f"file://{stack.objects_dir}"
    probe = stack.objects_dir / "probe"
    probe.write_bytes(b"x")
    assert probe.read_bytes() == b"x"
    probe.unlink()


def test_s3_put_get(seaweed: SeaweedS3) -> None:
    s3 = seaweed.client()
    s3.put_object(Bucket="tessera", Key="probe/a", Body=b"hello")  # type: ignore[attr-defined]
    body = s3.get_object(Bucket="tessera", Key="probe/a")["Body"].read()  # type: ignore[attr-defined]
    assert body == b"hello"
    # SeaweedFS's own log files are in the server's directory (by default glog writes them to
    # /tmp, where every start of every test run left them)
    assert (seaweed.data_dir / "weed.INFO").is_symlink()


def test_full_stack_with_s3_starts_and_stops_without_leftovers(server_dir: Path) -> None:
    with Stack(server_dir, s3=True, durable=False) as running:
        pids = running.pids()
        assert len(pids) == 3
        assert all(pid_alive(p) for p in pids)
        assert running.env()["TESSERA_OBJECT_STORE"] == "s3://tessera"
    assert not any(pid_alive(p) for p in pids)


def test_stack_failure_stops_what_started(server_dir: Path) -> None:
    stack = Stack(server_dir)
    with socket.socket() as occupied:
        occupied.bind(("127.0.0.1", stack.postgres.port))
        occupied.listen()
        with pytest.raises(StackError):
            stack.start()
    assert stack.nats.proc.pid is not None
    assert not pid_alive(stack.nats.proc.pid)


def test_occupied_port_gives_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as occupied:
        occupied.bind(("127.0.0.1", 0))
        occupied.listen()
        port = occupied.getsockname()[1]
        server = NatsServer(tmp_path, port=port)
        with pytest.raises(StackError) as err:
            server.start(timeout=10)
    message = str(err.value)
    assert "nats-server" in message and f"127.0.0.1:{port}" in message
    assert "within 10 s" in message and "its log" in message
    assert "address already in use" in message.lower()
    assert server.proc.pid is not None and not pid_alive(server.proc.pid)


def test_seaweedfs_starts_again_on_fresh_ports_when_one_was_taken(tmp_path: Path) -> None:
    """Its S3 listener binds last, so a port picked for it can be taken meanwhile (seen in the
    suite: another server's connection drew it from the ephemeral range): it exits at once,
    and it is started again on fresh ports (a port the caller fixed is kept, so that start
    fails after ``BIND_ATTEMPTS``; not run here: each failed start costs several seconds)."""
    with socket.socket() as occupied:
        occupied.bind(("127.0.0.1", 0))
        occupied.listen()
        port = occupied.getsockname()[1]
        server = SeaweedS3(tmp_path / "moved", s3_port=port)
        first = server.proc
        server._s3_port = None  # as if the pick had been free: the next attempt picks again
        server.start(timeout=30)
        try:
            assert first.pid is not None and not pid_alive(first.pid), "the first start exited"
            assert server.s3_port != port and server.proc is not first
            s3 = server.client()
            s3.put_object(Bucket="tessera", Key="probe/b", Body=b"moved")  # type: ignore[attr-defined]
            # the Unix sockets to remove are the ones weed made: the six named after the ports
            # of its running start exist (a wrong name would not)
            ports = {a.split("=", 1)[1] for a in server.proc.argv if "port" in a and "=" in a}
            current = {p for p in server.sockets if p.stem.rsplit("-", 1)[1] in ports}
            assert len(current) == 6 and all(p.is_socket() for p in current), current
        finally:
            server.stop()
    assert server.proc.pid is not None and not pid_alive(server.proc.pid)
    assert not [p for p in server.sockets if p.exists()]  # none left in /tmp


def test_readiness_timeout_names_what_and_shows_log(tmp_path: Path) -> None:
    silent = ManagedProcess("silent", ["sh", "-c", "echo started; exec sleep 30"], tmp_path / "l")
    silent.start()
    try:
        with pytest.raises(StackError) as err:
            wait_for(lambda: False, timeout=0.3, what="silent did not answer", proc=silent)
        assert "silent did not answer within 0.3 s; its log" in str(err.value)
        assert "started" in str(err.value)
    finally:
        silent.stop(timeout=2)
    assert silent.pid is not None and not pid_alive(silent.pid)


def test_a_restarted_process_reads_only_its_own_log_lines(tmp_path: Path) -> None:
    """The log is appended to across runs: an old 'started' must not count for a new run."""
    log = tmp_path / "svc.log"
    log.write_bytes(b'{"msg":"started"}\n' + b"x" * 200_000 + b"\nold last line\n")
    proc = ManagedProcess("svc", ["sh", "-c", "echo new run; exit 3"], log)
    proc.start()
    assert proc.wait(10) == 3
    assert proc.log_since_start() == "new run\n"
    assert proc.log_tail() == "new run"
    procs = ServiceProcesses({}, tmp_path)
    with pytest.raises(StackError, match="did not start"):
        procs.wait_started(proc, timeout=0.5)


def test_log_tail_reads_the_end_of_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    proc = ManagedProcess("long", ["sh", "-c", "seq 1 300000"], log)
    proc.start()
    assert proc.wait(30) == 0
    assert proc.log_tail(3).splitlines() == ["299998", "299999", "300000"]


def test_nothing_survives_a_sigkilled_supervisor(server_dir: Path) -> None:
    script = textwrap.dedent(
        f"""
        import pathlib, sys, time
        from shared.devstack.stack import Stack
        stack = Stack(pathlib.Path({str(server_dir)!r}), s3=True, durable=False).start()
        print(" ".join(map(str, stack.pids())), flush=True)
        print(" ".join(map(str, stack.s3.sockets)), flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        sockets = [Path(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and all(pid_alive(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    eventually_sync(
        lambda: not any(pid_alive(p) for p in pids), timeout=10, what="servers exit with parent"
    )
    # weed's Unix sockets in /tmp outlive a SIGKILLed supervisor (nothing ran its stop()): the
    # test removes what it caused
    assert sockets
    for path in sockets:
        path.unlink(missing_ok=True)


def test_a_weed_socket_is_removed_only_once_nobody_listens_on_it(tmp_path: Path) -> None:
    """A stop removes the socket files named for its ports; one a process still serves (another
    stack's weed holding a port this one failed to take) stays."""
    live, stale = tmp_path / "live.sock", tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as serving:
        serving.bind(str(live))
        serving.listen()
        with socket.socket(socket.AF_UNIX) as closed:
            closed.bind(str(stale))  # bound, never listening: what a stopped weed leaves
        _unlink_if_stale(live)
        _unlink_if_stale(stale)
        _unlink_if_stale(tmp_path / "absent.sock")
        assert live.is_socket() and not stale.exists()
