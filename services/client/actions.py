"""What the client commands do, one ``async`` function per command (given a session).

Each returns the exit status (see :mod:`services.client.commands`) and prints results on
stdout — job ids, tables, or with ``--json`` the raw reply, one JSON object per line — and
notes on stderr.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from kernel.loader import read_scene_file
from kernel.scene import SceneError
from proto.api import SubmitRequest
from proto.limits import Scene, TileSize, frame_range
from proto.names import RENDERER_TESSERA
from proto.povray import check_povray_options
from services.client import argtypes, output
from services.client.assets import blend_info, upload_scene
from services.client.session import EXIT_JOB_FAILED, EXIT_OK, EXIT_USAGE, CommandFailed, Session
from services.client.watch import watch_jobs
from shared.core.errors import DecodeError, ValidationError
from shared.core.lifecycle import JobState

__all__ = [
    "RENDERER_BY_SUFFIX",
    "load_scene",
    "parse_frames",
    "pick_renderer",
    "reference_options",
    "submit_requests",
]

RENDERER_BY_SUFFIX = {".blend": "blender", ".pov": "povray"}
"""The renderer ``tessera submit FILE`` picks by the file's extension (else tessera)."""
DEFAULT_WIDTH, DEFAULT_HEIGHT, DEFAULT_SPP = 320, 240, 16
"""A tessera scene's defaults."""
POVRAY_WIDTH, POVRAY_HEIGHT = 800, 600
"""POV-Ray's own default image size (``povray scene.pov`` without ``+W``/``+H``)."""


def _print_json(fields: dict[str, Any]) -> None:
    print(orjson.dumps({"ok": True, **fields}).decode(), flush=True)


def load_scene(arg: str) -> Scene:
    """A scene file (read, OBJ meshes inlined) if ``arg`` is a path, else a builtin name.

    Where the render stack is installed the document is validated here too, so a bad scene
    is a usage error (exit 2) before anything is sent; a client-only install (no numpy) leaves
    that to the gateway, which validates every scene with the kernel that will render it.
    """
    path = Path(arg)
    if not path.is_file() and os.sep not in arg and path.suffix != ".json":
        return arg
    try:
        doc = read_scene_file(path)
        validate = _local_validator()
        if validate is not None:
            validate(doc)
    except (SceneError, OSError) as exc:
        raise CommandFailed(f"scene file {arg}: {exc}", EXIT_USAGE) from exc
    return doc


def _local_validator() -> Callable[[object], object] | None:
    """The kernel's scene validation, or None on a client-only install (no numpy)."""
    try:
        from kernel.validate import validate_scene
    except ImportError:
        return None
    return validate_scene


def parse_frames(frame: int | None, frames: str | None) -> range:
    """``--frame N`` or ``--frames A-B`` (inclusive) as a range of frames, within the limits."""
    if frames is None:
        return range(frame or 0, (frame or 0) + 1)
    first, sep, last = frames.partition("-")
    try:
        return frame_range(int(first), int(last if sep else first))
    except ValueError as exc:
        raise CommandFailed(f"--frames {frames!r}: {exc}", EXIT_USAGE) from exc


def submit_requests(
    args: argparse.Namespace, scene: Scene, tile: TileSize, renderer: str = RENDERER_TESSERA
) -> list[SubmitRequest]:
    """One request per frame; a client key becomes ``KEY:FRAME`` when several frames go.

    Sizes, samples and seed left unset (``None``) take the tessera defaults (320x240, 16 spp,
    seed 0); :func:`scene_defaults` fills them in first for a Blender or POV-Ray scene.
    """
    frames = parse_frames(args.frame, args.frames)
    many = len(frames) > 1
    try:
        return [
            SubmitRequest(
                project=args.project,
                scene=scene,
                width=_given(args.width, DEFAULT_WIDTH),
                height=_given(args.height, DEFAULT_HEIGHT),
                spp=_given(args.spp, DEFAULT_SPP),
                frame=frame,
                tile_size=tile,
                max_depth=args.max_depth,
                seed=_given(args.seed, 0),
                renderer=renderer,
                idempotency_key=f"{args.key}:{frame}" if args.key and many else args.key,
                priority=getattr(args, "priority", 50),
                deadline=getattr(args, "deadline", None),
            )
            for frame in frames
        ]
    except (ValidationError, DecodeError) as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def pick_renderer(args: argparse.Namespace) -> str:
    """``--renderer``, else by the scene file's extension: ``.blend`` blender, ``.pov``
    povray, anything else (a JSON scene, a builtin name) tessera."""
    if getattr(args, "renderer", None):
        return str(args.renderer)
    return RENDERER_BY_SUFFIX.get(Path(args.scene).suffix.lower(), RENDERER_TESSERA)


async def scene_defaults(args: argparse.Namespace, renderer: str) -> None:
    """Fill in what a Blender or POV-Ray submit left unset, from the scene (in ``args``).

    Blender: width and height (the ``.blend``'s resolution times its percentage), samples
    (``cycles.samples``) and, for ``--frame``, the file's current frame. POV-Ray: POV-Ray's
    own default size, 800x600, and one sample (POV-Ray renders a tile once; spp only scales
    the accumulator). Options that do not apply are refused (exit 2).
    """
    if renderer == "blender":
        info = await blend_info(Path(args.scene))
        if args.frame is None and args.frames is None:
            args.frame = info.frame
        args.width = _given(args.width, info.width)
        args.height = _given(args.height, info.height)
        args.spp = _given(args.spp, info.samples)
    elif renderer == "povray":
        args.width = _given(args.width, POVRAY_WIDTH)
        args.height = _given(args.height, POVRAY_HEIGHT)
        args.spp = _given(args.spp, 1)


def reference_options(args: argparse.Namespace, renderer: str) -> dict[str, Any]:
    """The renderer options of a scene reference (checked as the gateway checks them)."""
    options: dict[str, Any] = {}
    wrong: list[str] = []
    povray_options = list(getattr(args, "povray_option", None) or [])
    per_pass = getattr(args, "samples_per_pass", None)
    if renderer == "blender":
        if args.seed is not None:
            options["seed"] = args.seed
        if per_pass is not None:
            options["samples_per_pass"] = per_pass
        wrong += ["--povray-option"] if povray_options else []
    elif renderer == "povray":
        if povray_options:
            try:
                options["options"] = check_povray_options(povray_options)
            except ValidationError as exc:
                raise CommandFailed(f"--povray-option: {exc}", EXIT_USAGE) from exc
        wrong += ["--samples-per-pass"] if per_pass is not None else []
    if wrong:
        raise CommandFailed(f"{', '.join(wrong)}: not an option of {renderer}", EXIT_USAGE)
    return options


async def _asset_scene(
    session: Session, args: argparse.Namespace, renderer: str, tile: TileSize
) -> Scene:
    """Upload the scene file as an asset; the reference a job of ``renderer`` names.

    Everything the client can check is checked before the upload: the options, and the
    requests' limits (with a stand-in reference).
    """
    options = reference_options(args, renderer)
    path = Path(args.scene)
    await scene_defaults(args, renderer)
    submit_requests(args, {"asset": "0" * 64, "main": path.name, **options}, tile, renderer)
    progress = sys.stderr.isatty() and not args.json
    asset, main = await upload_scene(session.client, path, renderer, progress)
    return {"asset": asset, "main": main, **options}


async def submit(session: Session, args: argparse.Namespace) -> int:
    """``tessera submit``: one request per frame; prints each job id.

    A ``.blend`` or ``.pov`` scene (or ``--renderer``) is first uploaded as an asset with
    everything it needs (:func:`services.client.assets.upload_scene`: only the chunks the store
    lacks), then each job names it by reference.
    """
    tile: TileSize = args.tile or argtypes.tile_size(session.settings.client.default_tile)
    renderer = pick_renderer(args)
    if renderer == RENDERER_TESSERA:
        if getattr(args, "povray_option", None) or getattr(args, "samples_per_pass", None):
            raise CommandFailed(
                "--povray-option, --samples-per-pass: not options of tessera", EXIT_USAGE
            )
        scene = load_scene(args.scene)
    else:
        scene = await _asset_scene(session, args, renderer, tile)
    requests = submit_requests(args, scene, tile, renderer)
    job_ids = []
    for request in requests:
        reply = await session.client.submit(request)
        job_ids.append(reply["job_id"])
        if args.json:
            _print_json(reply)
        else:
            print(reply["job_id"], flush=True)
            what = "created" if reply["created"] else "duplicate of an existing job"
            print(f"frame {request.frame}: {what} ({reply['state']})", file=sys.stderr)
    if args.watch:
        return await watch_jobs(session.client, job_ids, interval=args.interval)
    return EXIT_OK


async def status(session: Session, args: argparse.Namespace) -> int:
    """``tessera status JOB``."""
    reply = await session.client.status(args.job)
    if args.json:
        _print_json(reply)
    else:
        print(output.status_text(reply))
    return EXIT_OK


async def list_jobs(session: Session, args: argparse.Namespace) -> int:
    """``tessera list``: a page of jobs, newest first."""
    reply = await session.client.list(state=args.state, limit=args.limit, cursor=args.cursor)
    if args.json:
        _print_json(reply)
        return EXIT_OK
    print(output.jobs_table(reply["jobs"]))
    if reply["next_cursor"]:
        print(f"more: tessera list --cursor {reply['next_cursor']}", file=sys.stderr)
    return EXIT_OK


async def cancel(session: Session, args: argparse.Namespace) -> int:
    """``tessera cancel JOB``."""
    reply = await session.client.cancel(args.job)
    if args.json:
        _print_json(reply)
    else:
        print(f"{reply['job_id']}: cancel requested (state {reply['state']})")
    return EXIT_OK


async def retry(session: Session, args: argparse.Namespace) -> int:
    """``tessera retry JOB``."""
    reply = await session.client.retry(args.job)
    if args.json:
        _print_json(reply)
    else:
        print(f"{reply['job_id']}: queued again as generation {reply['generation']}")
    return EXIT_OK


async def pause(session: Session, args: argparse.Namespace) -> int:
    """``tessera pause JOB``."""
    reply = await session.client.pause(args.job)
    if args.json:
        _print_json(reply)
    else:
        print(f"{reply['job_id']}: paused ({reply['tiles_unreleased']} queued tiles held back; "
              "in-flight tiles stop at their next pass)")  # fmt: skip
    return EXIT_OK


async def resume(session: Session, args: argparse.Namespace) -> int:
    """``tessera resume JOB``."""
    reply = await session.client.resume(args.job)
    if args.json:
        _print_json(reply)
    else:
        print(f"{reply['job_id']}: resumed (state {reply['state']})")
    return EXIT_OK


async def set_priority(session: Session, args: argparse.Namespace) -> int:
    """``tessera priority JOB N``."""
    reply = await session.client.set_priority(args.job, args.priority)
    if args.json:
        _print_json(reply)
    else:
        print(f"{reply['job_id']}: priority {reply['priority']} (state {reply['state']})")
    return EXIT_OK


def default_actor(session: Session) -> str:
    """The audit's actor when ``--actor`` is not given: the NATS user of the URL, else the
    login name."""
    for url in session.settings.nats_urls:
        user = urlsplit(url).username
        if user:
            return user
    return getpass.getuser()


async def project_set(session: Session, args: argparse.Namespace) -> int:
    """``tessera project set NAME --weight W [--max-in-flight N|none] [--actor A]``."""
    actor = args.actor or default_actor(session)
    reply = await session.client.project_set(
        args.name, weight=args.weight, max_in_flight=args.max_in_flight, actor=actor
    )
    if args.json:
        _print_json(reply)
    else:
        cap = "none" if reply["max_in_flight"] is None else reply["max_in_flight"]
        print(f"project {reply['name']}: weight {reply['weight']:g}, max in flight {cap} "
              f"(by {reply['actor']})")  # fmt: skip
    return EXIT_OK


async def project_list(session: Session, args: argparse.Namespace) -> int:
    """``tessera project list``."""
    reply = await session.client.project_list()
    if args.json:
        _print_json(reply)
    else:
        print(output.projects_table(reply["projects"]))
        print(f"share over the last {reply['window_seconds']:g} s", file=sys.stderr)
    return EXIT_OK


async def project_show(session: Session, args: argparse.Namespace) -> int:
    """``tessera project show NAME``."""
    reply = await session.client.project_show(args.name)
    if args.json:
        _print_json(reply)
    else:
        print(output.projects_table([reply["project"]]))
        print(f"share over the last {reply['window_seconds']:g} s", file=sys.stderr)
    return EXIT_OK


async def watch(session: Session, args: argparse.Namespace) -> int:
    """``tessera watch JOB...``."""
    return await watch_jobs(session.client, args.jobs, interval=args.interval)


async def get(session: Session, args: argparse.Namespace) -> int:
    """``tessera get JOB``: fetch the final image (and the float image), sha256-verified.

    Through the gateway (``tessera.api.result``): a presigned URL or chunks over NATS, so the
    client needs no object-store credentials.
    """
    reply = await session.client.status(args.job)
    if reply["state"] != JobState.COMPLETED or not reply.get("result_location"):
        status = EXIT_JOB_FAILED
        raise CommandFailed(
            f"job {args.job} is {reply['state']}: only a completed job has a result", status
        )
    if args.float and not reply.get("float_location"):
        raise CommandFailed(f"job {args.job} has no float image", EXIT_JOB_FAILED)
    targets = [Path(args.output or f"{args.job}.png"), *([Path(args.float)] if args.float else [])]
    for target in targets:  # before downloading anything: all the files or none
        if problem := output.cannot_write(target):
            raise CommandFailed(problem, EXIT_USAGE)
    client = session.client
    png = await client.download(args.job, kind="png", inline=args.inline)
    floats = (
        await client.download(args.job, kind="float", inline=args.inline) if args.float else None
    )
    _write(targets[0], png)
    if floats is not None:
        _write(targets[1], floats)
    print(args.output or f"{args.job}.png")
    return EXIT_OK


def _write(path: Path, data: bytes) -> None:
    try:
        output.write_atomic(path, data)
    except OSError as exc:
        raise CommandFailed(f"cannot write {path}: {exc.strerror or exc}", EXIT_USAGE) from exc


async def dlq_list(session: Session, args: argparse.Namespace) -> int:
    """``tessera dlq list``."""
    reply = await session.client.dlq_list(job_id=args.job, limit=args.limit, cursor=args.cursor)
    if args.json:
        _print_json(reply)
        return EXIT_OK
    print(output.dead_letters_table(reply["dead_letters"]))
    if reply["next_cursor"]:
        print(f"more: tessera dlq list --cursor {reply['next_cursor']}", file=sys.stderr)
    return EXIT_OK


async def dlq_show(session: Session, args: argparse.Namespace) -> int:
    """``tessera dlq show SEQ``."""
    reply = await session.client.dlq_show(args.seq)
    print(orjson.dumps({"ok": True, **reply}, option=orjson.OPT_INDENT_2).decode())
    return EXIT_OK


async def dlq_purge(session: Session, args: argparse.Namespace) -> int:
    """``tessera dlq purge (--job JOB | --all) [--dry-run]``."""
    reply = await session.client.dlq_purge(
        job_id=args.job, everything=args.all, dry_run=args.dry_run
    )
    if args.json:
        _print_json(reply)
    else:
        verb = "would purge" if reply["dry_run"] else "purged"
        print(f"{verb} {reply['matched']} dead letter(s)")
    return EXIT_OK
