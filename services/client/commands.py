"""Client commands of ``tessera``: submit, status, watch, get, list, cancel, retry, priority,
pause, resume, project, dlq.

They read their settings from the environment (``Settings.from_env``: ``TESSERA_NATS_URL``,
``TESSERA_NAMESPACE`` ...; neither ``TESSERA_DATABASE_URL`` nor the object store: ``get``
downloads through the gateway) and talk to the gateways over NATS.

Exit status, for scripts:

====  ==========================================================================================
0     success (``watch``/``submit --watch``: every job completed)
1     a job ended failed, cancelled or dead-lettered, or has no result yet (``watch``, ``get``)
2     usage or configuration error (bad option, unreadable scene file, missing variable, a
      request larger than the API's 5 MiB or the NATS server's max_payload: never sent)
3     the gateway answered with an error: prints ``error[code]: message`` (bad_request,
      invalid, conflict, not_found, illegal_state, internal)
4     unavailable: no gateway answered within ``--timeout``, NATS or a store is unreachable,
      or the gateway still answered ``busy`` when ``--timeout`` ran out
====  ==========================================================================================

A ``busy`` reply (the gateway's intake is full, nothing was done) is retried after the reply's
``retry_after`` hint until ``--timeout`` has passed.

``--json`` prints the raw reply (one JSON object per line).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeAlias

from proto.limits import DEFAULT_BOUNCES
from proto.names import RENDERERS
from services.client import actions, argtypes, recovery
from services.client.api import DEFAULT_TIMEOUT
from services.client.argtypes import positive_float
from services.client.session import Session, run_command
from shared.core.lifecycle import JobState

__all__ = ["EPILOG", "register"]

EPILOG = (
    "exit status: 0 ok; 1 job failed, cancelled, dead-lettered or not completed; "
    "2 usage or configuration error, an output file that cannot be written, or a request "
    "too large to send; "
    "3 error reply from the gateway (error[code]: message); "
    "4 unavailable (no gateway answered within --timeout, NATS unreachable, or still busy: "
    "busy replies are retried after their retry_after hint until --timeout)"
)

Action = Callable[[Session, argparse.Namespace], Awaitable[int]]
Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _run(action: Action, args: argparse.Namespace) -> int:
    async def command(session: Session) -> int:
        return await action(session, args)

    return run_command(command, timeout=args.timeout)


def _command(sub: Sub, name: str, action: Action, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text, epilog=EPILOG)
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for a gateway (default {DEFAULT_TIMEOUT:g})",
    )
    p.set_defaults(func=partial(_run, action))
    return p


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the raw reply as JSON")


def _add_submit(sub: Sub) -> None:
    p = _command(sub, "submit", actions.submit, "submit one frame, or one job per frame")
    p.add_argument(
        "scene",
        metavar="SCENE|BUILTIN",
        help="scene file (JSON/OBJ scene, .blend, .pov) or builtin scene name",
    )
    p.add_argument(
        "--renderer",
        choices=RENDERERS,
        default=None,
        help="tessera, blender or povray (default: by the file's extension, .blend blender, "
        ".pov povray, else tessera); a .blend or .pov is uploaded as an asset first",
    )
    frames = p.add_mutually_exclusive_group()
    frames.add_argument("--frame", type=int, default=None,
                        help="frame number (default 0; a .blend: its current frame)")  # fmt: skip
    frames.add_argument("--frames", metavar="A-B", help="submit frames A..B, one job each")
    p.add_argument("--width", type=int, default=None,
                   help="pixels (default 320; a .blend: its resolution; a .pov: 800)")  # fmt: skip
    p.add_argument("--height", type=int, default=None,
                   help="pixels (default 240; a .blend: its resolution; a .pov: 600)")  # fmt: skip
    p.add_argument("--spp", type=int, default=None,
                   help="samples per pixel (default 16; a .blend: its cycles.samples; a .pov: 1, "
                   "POV-Ray renders each tile once)")  # fmt: skip
    p.add_argument(
        "--tile",
        type=argtypes.tile_size,
        default=None,
        metavar="auto|N",
        help="tile edge in pixels (8..1024), or auto: the scheduler picks it so that a tile "
        "takes about TESSERA_TILE_SECONDS on one core (default TESSERA_DEFAULT_TILE, auto)",
    )
    p.add_argument(
        "--povray-option",
        action="append",
        default=None,
        metavar="OPT",
        help="a POV-Ray option, repeatable (+A0.1, +R3, +Q9, +K0.5, Declare=X=1): only options "
        "that tile exactly; jitter, size, output and region options are refused (exit 2)",
    )
    p.add_argument(
        "--samples-per-pass",
        type=argtypes.positive_int,
        default=None,
        metavar="N",
        help="Blender: samples per checkpointed pass (default 32); with N >= spp each tile is "
        "one pass and the float image equals Blender's own render value for value",
    )
    p.add_argument(
        "--max-depth",
        type=int,
        default=DEFAULT_BOUNCES,
        help=f"bounces (default {DEFAULT_BOUNCES})",
    )
    p.add_argument("--seed", type=int, default=None,
                   help="noise seed (default 0; a .blend: its cycles.seed)")  # fmt: skip
    p.add_argument("--project", default="default", help="project name (default 'default')")
    p.add_argument("--key", default=None, help="idempotency key (KEY:FRAME for a range)")
    p.add_argument("--priority", type=argtypes.priority, default=50,
                   help="0..100, higher is released first (default 50)")  # fmt: skip
    p.add_argument(
        "--deadline",
        type=argtypes.deadline,
        default=None,
        metavar="WHEN",
        help="fail the job (deadline_exceeded) if not completed by then: 30s, 90m, 2h, 1d "
        "from now, or an ISO 8601 time with a UTC offset",
    )
    p.add_argument("--watch", action="store_true", help="then watch the jobs to the end")
    p.add_argument(
        "--interval", type=positive_float, default=2.0, help="watch poll interval, seconds"
    )
    _json(p)


def _add_jobs(sub: Sub) -> None:
    p = _command(sub, "status", actions.status, "show a job's state and progress")
    p.add_argument("job", metavar="JOB", help="job id, as submit printed it")
    _json(p)
    p = _command(sub, "watch", actions.watch, "follow jobs with progress bars until they end")
    p.add_argument("jobs", metavar="JOB", nargs="+", help="job ids to follow")
    p.add_argument(
        "--interval", type=positive_float, default=2.0, help="status poll interval, seconds"
    )
    p = _command(sub, "get", actions.get, "download a completed job's image (sha256-verified)")
    p.add_argument("job", metavar="JOB", help="job id, as submit printed it")
    p.add_argument("-o", "--output", default=None, help="PNG path (default JOB.png)")
    p.add_argument("--float", default=None, metavar="PATH", help="also fetch the float image")
    p.add_argument(
        "--inline",
        action="store_true",
        help="download over NATS even where the store gives a presigned URL",
    )
    p = _command(sub, "list", actions.list_jobs, "list jobs, newest first")
    p.add_argument(
        "--state",
        choices=[s.value for s in JobState],
        default=None,
        help="only jobs in this state (default: all)",
    )
    p.add_argument("--limit", type=int, default=None, help="page size (default 100)")
    p.add_argument("--cursor", default=None, help="next_cursor of the previous page")
    _json(p)
    for name, action, text in (
        ("cancel", actions.cancel, "cancel a job"),
        ("retry", actions.retry, "re-queue a failed or dead-lettered job"),
        ("pause", actions.pause, "pause a job: in-flight tiles checkpoint and are handed back"),
        ("resume", actions.resume, "resume a paused job from its checkpoints"),
    ):
        p = _command(sub, name, action, text)
        p.add_argument("job", metavar="JOB", help="job id, as submit printed it")
        _json(p)
    p = _command(sub, "priority", actions.set_priority, "change a job's priority (0..100)")
    p.add_argument("job", metavar="JOB", help="job id, as submit printed it")
    p.add_argument("priority", metavar="N", type=argtypes.priority, help="0..100")
    _json(p)


def _add_projects(sub: Sub) -> None:
    project = sub.add_parser("project", help="fair-share weights and caps of projects",
                             epilog=EPILOG)  # fmt: skip
    verbs = project.add_subparsers(dest="project_command", required=True, metavar="VERB")
    p = _command(verbs, "set", actions.project_set, "set a project's weight and in-flight cap")
    p.add_argument("name", metavar="NAME", help="project name")
    p.add_argument("--weight", type=argtypes.weight, required=True,
                   help="fair-share weight, a finite number > 0")  # fmt: skip
    p.add_argument("--max-in-flight", type=argtypes.max_in_flight, default=None, metavar="N",
                   help="cap on its leased tiles, or 'none' (the default)")  # fmt: skip
    p.add_argument("--actor", default=None,
                   help="who makes the change, for the audit (default: the NATS user)")  # fmt: skip
    _json(p)
    p = _command(verbs, "list", actions.project_list, "list projects, their tiles and share")
    _json(p)
    p = _command(verbs, "show", actions.project_show, "show one project")
    p.add_argument("name", metavar="NAME", help="project name")
    _json(p)


def _add_dlq(sub: Sub) -> None:
    dlq = sub.add_parser("dlq", help="inspect, requeue and purge dead letters", epilog=EPILOG)
    verbs = dlq.add_subparsers(dest="dlq_command", required=True, metavar="VERB")
    p = _command(verbs, "list", actions.dlq_list, "list dead letters, oldest first")
    p.add_argument("--job", default=None, metavar="JOB", help="only this job's")
    p.add_argument("--limit", type=int, default=None, help="page size (default 100)")
    p.add_argument("--cursor", default=None, help="next_cursor of the previous page")
    _json(p)
    p = _command(verbs, "show", actions.dlq_show, "show one dead letter with its payload")
    p.add_argument("seq", type=int, metavar="SEQ", help="the letter's DLQ sequence (dlq list)")
    p = _command(verbs, "requeue", recovery.dlq_requeue, "re-render dead-lettered work, paced")
    p.add_argument("--job", default=None, metavar="JOB", help="only this job's dead letters")
    p.add_argument("--dry-run", action="store_true", help="list what would be requeued, and why")
    p.add_argument("--rate", type=recovery.parse_rate, default=None, metavar="N/s",
                   help="requeues per second (default 10)")  # fmt: skip
    p.add_argument("--limit", type=int, default=None, help="at most this many dead letters")
    p.add_argument("--seq", type=argtypes.positive_int, action="append", default=None,
                   metavar="SEQ", help="only this dead letter (its DLQ sequence, dlq list); "
                   "repeatable")  # fmt: skip
    _json(p)
    p = _command(verbs, "purge", actions.dlq_purge, "delete dead letters")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", default=None, metavar="JOB", help="this job's dead letters")
    which.add_argument("--all", action="store_true", help="every dead letter")
    p.add_argument("--dry-run", action="store_true", help="only count")
    _json(p)


def register(sub: Sub) -> None:
    """Add the client commands to the ``tessera`` command."""
    _add_submit(sub)
    _add_jobs(sub)
    _add_projects(sub)
    _add_dlq(sub)
