"""``tessera up`` and ``tessera demo``: the embedded stack in the foreground (``up`` also runs
the web console, see :func:`web_env`)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import uvloop

from services.cli.demo_scenes import BlenderMissing, build_demo_blend, write_demo_pov
from services.client.argtypes import non_negative_int, positive_float, positive_int
from services.client.output import cannot_write, write_atomic
from shared.core.errors import ValidationError
from shared.devstack.procs import ManagedProcess, wait_for
from shared.devstack.stack import Stack, StackError
from shared.devstack.supervisor import Child, RestartLimits, Supervisor

if TYPE_CHECKING:
    from proto.api import SubmitRequest

__all__ = ["ServiceProcesses", "register", "run_demo", "run_up"]

SERVICES = ("gateway", "scheduler", "worker", "finalizer")
#: the web console's port under ``up`` when TESSERA_WEB_PORT is not set (and it is free)
WEB_PORT = 8470
#: a service's exit codes that restarting cannot fix (see shared.service.runtime.service_main); the
#: servers' exit codes mean other things, so a server that exits 2 is restarted as usual
SERVICE_FINAL_EXITS: Mapping[int, str] = {2: "configuration error"}
#: the checkout (or install) root the services are started in, so `-m services.<name>` runs
#: this tree's code even where another checkout is the one installed in the environment
_REPO = Path(__file__).resolve().parent.parent.parent


class ServiceProcesses:
    """A set of service processes sharing one environment (one test's namespace).

    ``service_env`` adds per-service variables (with NATS auth: each service's own user URL);
    ``tree``: the checkout whose code the services run (default: this one).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        log_dir: Path,
        *,
        service_env: Callable[[str], Mapping[str, str]] | None = None,
        tree: Path | None = None,
    ) -> None:
        self.env = dict(env)
        self.log_dir = log_dir
        self.service_env = service_env
        self.tree = _REPO if tree is None else tree
        self.procs: dict[str, ManagedProcess] = {}

    def start(
        self, service: str, *, name: str | None = None, env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        """Start one service process; ``name`` distinguishes replicas (``worker-2``)."""
        name = name or service
        own = dict(self.service_env(service)) if self.service_env else {}
        full_env = os.environ | self.env | {"TESSERA_NODE": name} | own | dict(env or {})
        proc = ManagedProcess(
            name,
            [sys.executable, "-m", f"services.{service}"],
            self.log_dir / f"{name}.log",
            env=full_env,
            cwd=self.tree,
        )
        proc.start()
        self.procs[name] = proc
        return proc

    def start_all(self, workers: int = 1, *, scheduler_first: bool = False) -> None:
        """Gateway, scheduler, finalizer and ``workers`` workers.

        ``scheduler_first``: start the others only once the scheduler has declared the topology
        (needed when it is the only user allowed to create it, see :mod:`shared.devstack.natsauth`).
        """
        if scheduler_first:
            self.wait_started(self.start("scheduler"))
        for service in ("gateway", "scheduler", "finalizer"):
            if service not in self.procs:
                self.start(service)
        for i in range(workers):
            self.start("worker", name=f"worker-{i + 1}")

    def wait_started(self, proc: ManagedProcess, timeout: float = 60.0) -> None:
        """Block (bounded) until ``proc`` logs that it started: topology declared, connected."""

        def started() -> bool:  # this run's lines only: the log outlives runs of `up`
            return '"msg":"started"' in proc.log_since_start()

        wait_for(started, timeout=timeout, what=f"{proc.name} did not start", proc=proc)

    def restart(self, name: str, *, env: Mapping[str, str] | None = None) -> ManagedProcess:
        """Start ``name`` again after it died, like a supervisor would."""
        old = self.procs[name]
        service = old.argv[-1].removeprefix("services.")
        return self.start(service, name=name, env=env)

    def kill(self, name: str) -> None:
        """SIGKILL one service process."""
        self.procs[name].kill()

    def pause(self, name: str) -> None:
        """SIGSTOP one service process."""
        self.procs[name].signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT one service process."""
        self.procs[name].signal(signal.SIGCONT)

    def stop_all(self) -> None:
        """SIGTERM every process (SIGKILL after a bound)."""
        for proc in self.procs.values():
            proc.signal(signal.SIGCONT)
            proc.stop(timeout=10)

    def logs(self) -> str:
        """The tail of every service log, for assertion messages."""
        return "\n".join(
            f"--- {name} ---\n{proc.log_tail(40)}" for name, proc in self.procs.items()
        )


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM; the previous handlers come back afterwards."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def export_lines(env: Mapping[str, str]) -> str:
    """``export NAME=value`` lines a shell can evaluate."""
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def _supervisor(stack: Stack, procs: ServiceProcesses, limits: RestartLimits) -> Supervisor:
    """Every server and service of ``up``; a server's restart waits until it is ready again.

    A service that exits 2 (a configuration error) is not restarted: ``up`` gives up at once.
    """
    children = [Child(server.proc, server.start) for server in stack.servers()]
    children += [Child(p, p.start, final_exits=SERVICE_FINAL_EXITS) for p in procs.procs.values()]
    return Supervisor(children, limits, pid_file=stack.data_dir / "pids.json")


def web_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What ``up`` gives the web console: loopback, a port, and a token.

    ``TESSERA_WEB_PORT`` and ``TESSERA_WEB_TOKEN`` are kept when set; otherwise the port is
    :data:`WEB_PORT` (or a free one if that is taken) and the token a fresh operator token,
    which ``up`` prints with the other ``export`` lines.
    """
    import secrets
    import socket

    from shared.devstack.procs import free_port

    def port_free(port: int) -> bool:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    out = {"TESSERA_WEB_HOST": environ.get("TESSERA_WEB_HOST", "").strip() or "127.0.0.1"}
    port = environ.get("TESSERA_WEB_PORT", "").strip()
    out["TESSERA_WEB_PORT"] = port or str(WEB_PORT if port_free(WEB_PORT) else free_port())
    token = environ.get("TESSERA_WEB_TOKEN", "").strip()
    out["TESSERA_WEB_TOKEN"] = token or f"operator:{secrets.token_urlsafe(24)}"
    return out


def run_up(
    data_dir: Path,
    *,
    s3: bool,
    workers: int,
    services: bool,
    auth: bool = False,
    limits: RestartLimits | None = None,
) -> int:
    """Run the stack (and the four services) until SIGINT/SIGTERM, restarting what dies.

    ``auth``: NATS with one least-privilege user per service and one for clients; the printed
    ``TESSERA_NATS_URL`` is the client user's. ``limits``: see :class:`RestartLimits`; a child
    that fails more often than they allow stops everything (exit 1), so does a service that
    exits with a configuration error, at once (exit 2).
    """
    namespace = os.environ.get("TESSERA_NAMESPACE", "").strip()
    stack = Stack(data_dir, s3=s3, auth=auth, namespace=namespace)
    procs = ServiceProcesses(stack.env(), stack.data_dir / "logs", service_env=stack.service_env)
    web = web_env(os.environ) if services else {}
    with _stop_on_signals() as stop:
        try:
            stack.start()
            procs.env = stack.env()
            if services:
                procs.start_all(workers=workers, scheduler_first=auth)
                procs.start("web", env=web)
        except StackError as exc:
            print(f"tessera up: {exc}", file=sys.stderr)
            # with --auth the scheduler must start first: a bad variable ends here
            config = any(p.wait(0) in SERVICE_FINAL_EXITS for p in procs.procs.values())
            procs.stop_all()
            stack.stop()
            return 2 if config else 1
        supervisor = _supervisor(stack, procs, limits or RestartLimits())
        try:
            exports = stack.env() | {k: v for k, v in web.items() if k == "TESSERA_WEB_TOKEN"}
            print(export_lines(exports), flush=True)
            if web:
                url = f"http://{web['TESSERA_WEB_HOST']}:{web['TESSERA_WEB_PORT']}/"
                print(f"# web console: {url} (log in with TESSERA_WEB_TOKEN's token, without "
                      "its 'operator:' prefix)", file=sys.stderr)  # fmt: skip
            what = "stack and services" if services else "stack"
            pids = ", ".join(f"{name} PID {pid}" for name, pid in supervisor.pids().items())
            print(f"# {what} running ({pids}; also in {supervisor.pid_file}); data and logs in "
                  f"{stack.data_dir}; Ctrl-C stops everything", file=sys.stderr)  # fmt: skip
            return supervisor.run(stop)
        finally:
            procs.stop_all()
            stack.stop()
            supervisor.remove_pid_file()
            print(f"tessera up: stopped everything; restarts: {supervisor.summary()}",
                  file=sys.stderr)  # fmt: skip


#: the size of the Blender and POV-Ray demo frames
DEMO_SIZE = (320, 240)
#: POV-Ray options of the demo: adaptive anti-aliasing, which Tessera tiles exactly
DEMO_POVRAY_OPTIONS = ["+A0.1", "+R3"]


def run_demo(
    data_dir: Path | None, *, s3: bool, out: Path, spp: int, renderer: str = "tessera"
) -> int:
    """Render a sample scene end to end through all four services; write the PNG.

    ``tessera`` renders the builtin cornell scene; ``blender`` the demo ``.blend`` that
    :mod:`services.cli.demo_blend` builds with Blender's Python (320x240, ``spp`` samples, one
    pass per tile); ``povray`` a bundled ``.pov`` with an include file (320x240, anti-aliased).
    Both are uploaded as assets as ``tessera submit`` does.

    Exit status: 0 written, 1 the stack or the job failed, 2 bad arguments (checked before any
    server starts: the request's limits, a writable directory for ``out``, the renderer on PATH).
    """
    from proto.api import SubmitRequest

    width, height = DEMO_SIZE
    if renderer == "povray":
        spp = 1  # POV-Ray renders each tile once: samples only scale its accumulator
    try:
        request = SubmitRequest(
            project="demo", scene="cornell", width=width, height=height, spp=spp, tile_size=64
        )
    except ValidationError as exc:
        print(f"tessera demo: {exc}", file=sys.stderr)
        return 2
    if problem := cannot_write(out):
        print(f"tessera demo: {problem}", file=sys.stderr)
        return 2
    if renderer != "tessera" and shutil.which(renderer) is None:
        print(f"tessera demo: {renderer} is not on PATH (apt-get install {renderer})",
              file=sys.stderr)  # fmt: skip
        return 2
    with _stop_on_signals(), tempfile.TemporaryDirectory(prefix="tessera-demo-") as tmp:
        root = data_dir or Path(tmp)
        try:
            scene = _demo_scene(renderer, Path(tmp) / "scene", spp)
            with Stack(root, s3=s3) as stack:
                print(f"tessera demo: stack up (NATS {stack.nats.url}, PostgreSQL, "
                      f"object store {stack.env()['TESSERA_OBJECT_STORE']})")  # fmt: skip
                procs = ServiceProcesses(stack.env(), stack.data_dir / "logs")
                try:
                    procs.start_all(workers=1)
                    result = uvloop.run(_demo_job(stack.env(), request, renderer, scene))
                finally:
                    procs.stop_all()
                if result is None:
                    print(f"tessera demo: failed; service logs:\n{procs.logs()}", file=sys.stderr)
                    return 1
        except (StackError, BlenderMissing, KeyboardInterrupt) as exc:
            print(f"tessera demo: {exc or 'interrupted'}", file=sys.stderr)
            return 1
    png, sha = result
    try:
        write_atomic(out, png)
    except OSError as exc:
        print(f"tessera demo: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"tessera demo: wrote {out.resolve()} ({len(png)} bytes, sha256 {sha[:16]}...)")
    print("tessera demo: every server and service it started has been stopped.")
    return 0


def _demo_scene(renderer: str, directory: Path, spp: int) -> Path | None:
    """The demo's scene file for ``renderer`` (None: the builtin cornell scene)."""
    if renderer == "blender":
        directory.mkdir(parents=True, exist_ok=True)
        width, height = DEMO_SIZE
        return build_demo_blend(directory / "demo.blend", width, height, spp)
    if renderer == "povray":
        return write_demo_pov(directory)
    return None


async def _demo_job(
    env: Mapping[str, str], request: SubmitRequest, renderer: str, scene: Path | None
) -> tuple[bytes, str] | None:
    from dataclasses import replace

    from proto.limits import tile_count
    from proto.names import Names
    from services.client.api import TesseraClient
    from services.client.assets import upload_scene
    from services.client.watch import watch_jobs
    from shared.core.config import Settings
    from shared.nats.jetstream import connect_nats
    from shared.objectstore import open_object_store

    settings = Settings.from_env(env)
    nc = await connect_nats(settings, name="tessera-demo")
    try:
        client = TesseraClient(nc, Names(settings.deployment.namespace), timeout=60)
        what = "cornell"
        if scene is not None:
            asset, main = await upload_scene(client, scene, renderer, sys.stderr.isatty())
            ref: dict[str, object] = {"asset": asset, "main": main}
            if renderer == "blender":  # one pass per tile: Blender's own render, exactly
                ref["samples_per_pass"] = request.spp
            else:
                ref["options"] = DEMO_POVRAY_OPTIONS
            request = replace(request, scene=ref, renderer=renderer)
            what = f"{renderer} {main}"
        reply = await client.submit(request)
        job_id = reply["job_id"]
        edge = request.tile_size
        tiles = (
            "auto-sized"
            if isinstance(edge, str)
            else tile_count(request.width, request.height, edge)
        )
        print(f"tessera demo: submitted job {job_id} ({what} {request.width}x{request.height}, "
              f"{request.spp} spp, {tiles} tiles)")  # fmt: skip
        if await watch_jobs(client, [job_id], interval=0.5) != 0:
            return None
        status = await client.status(job_id)
        store = await open_object_store(settings.object_store)
        try:
            png = await store.get(status["result_location"], sha256=status["result_sha256"])
        finally:
            await store.close()
    finally:
        await nc.close()
    return png, str(status["result_sha256"])


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``up`` and ``demo`` to the ``tessera`` command."""
    up = sub.add_parser(
        "up",
        help="run the embedded stack, the four services and the web console in the foreground",
        epilog="a server or service that exits is restarted with exponential backoff, except a "
        "service that exits 2 (a configuration error, which restarting cannot fix); exit "
        "status: 0 stopped by Ctrl-C or SIGTERM; 1 a server or service failed to start, or "
        "failed more than --max-restarts times within --restart-window; 2 usage error, or a "
        "service exited with a configuration error (a bad TESSERA_* variable, a topology the "
        "server refuses)",
    )
    up.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".tessera"),
        help="where servers keep their data and services their logs (default: ./.tessera)",
    )
    up.add_argument("--s3", action="store_true", help="use SeaweedFS S3 instead of a directory")
    up.add_argument("--workers", type=positive_int, default=1, help="worker processes (default: 1)")
    up.add_argument(
        "--stack-only", action="store_true", help="run the servers only, not the services"
    )
    up.add_argument(
        "--auth",
        action="store_true",
        help="NATS with one least-privilege user per service and one for clients (docs/scaling.md)",
    )
    defaults = RestartLimits()
    up.add_argument(
        "--max-restarts",
        type=non_negative_int,
        default=defaults.max_restarts,
        help="restarts of one server or service allowed within --restart-window before up "
        f"gives up and stops everything (0: never restart; default: {defaults.max_restarts})",
    )
    up.add_argument(
        "--restart-window",
        type=positive_float,
        default=defaults.window,
        metavar="SECONDS",
        help=f"seconds over which --max-restarts counts failures (default: {defaults.window:g})",
    )
    up.set_defaults(func=_run_up)

    demo = sub.add_parser(
        "demo",
        help="render the sample scene end to end on the embedded stack",
        epilog="exit status: 0 PNG written; 1 the stack or the job failed (service logs are "
        "printed); 2 usage error (checked before any server starts)",
    )
    demo.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: temp)")
    demo.add_argument("--s3", action="store_true", help="use SeaweedFS S3 instead of a directory")
    demo.add_argument(
        "-o", "--out", type=Path, default=Path("tessera-demo.png"), help="PNG to write"
    )
    demo.add_argument("--spp", type=int, default=64, help="samples per pixel (default: 64)")
    demo.add_argument(
        "--renderer",
        choices=("tessera", "blender", "povray"),
        default="tessera",
        help="tessera: the builtin cornell scene; blender: a .blend built by Blender's Python "
        "(services/cli/demo_blend.py); povray: a bundled .pov with an include file "
        "(default: tessera)",
    )
    demo.set_defaults(
        func=lambda a: run_demo(a.data_dir, s3=a.s3, out=a.out, spp=a.spp, renderer=a.renderer)
    )


def _run_up(a: argparse.Namespace) -> int:
    limits = RestartLimits(max_restarts=a.max_restarts, window=a.restart_window)
    services = not a.stack_only
    return run_up(
        a.data_dir, s3=a.s3, workers=a.workers, services=services, auth=a.auth, limits=limits
    )
