"""Operator commands of ``tessera``: ``gc`` and ``top``.

Both read the stores directly (PostgreSQL, the object store, JetStream), with the same
``TESSERA_*`` environment as the services; neither needs a gateway. Exit status as for the
client commands (:mod:`services.client.commands`): 0 ok, 2 usage or configuration error,
4 a store is unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeAlias

import orjson

from proto import names as n
from services.cli.ops.gc import collect, find_garbage, parse_age
from services.cli.ops.top import render, snapshot
from services.client.argtypes import positive_float
from services.client.session import EXIT_OK, EXIT_USAGE, CommandFailed, Session, run_command
from shared.core.errors import ConfigError, RetryableError, ValidationError
from shared.metadata import MetadataStore
from shared.nats.leases import ProgressPointers
from shared.objectstore import open_object_store
from shared.service.runtime import topology_for

__all__ = ["register"]

Action = Callable[[Session, argparse.Namespace], Awaitable[int]]
Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
_CLEAR = "\x1b[H\x1b[2J"


def _run(action: Action, args: argparse.Namespace) -> int:
    async def command(session: Session) -> int:
        return await action(session, args)

    return run_command(command, timeout=args.timeout)


async def _db(session: Session) -> MetadataStore:
    """PostgreSQL, which ``gc`` and ``top`` read directly (the other commands ask a gateway)."""
    if not session.settings.database_url:
        # Never asyncpg's fallback to libpq defaults (PGHOST, the local socket): a wrong database.
        raise ConfigError(
            "TESSERA_DATABASE_URL is not set: this command reads PostgreSQL directly "
            "(see the Configuration section of the README)"
        )
    return await MetadataStore.connect(session.settings.database_url, max_size=2, migrate=False)


async def gc(session: Session, args: argparse.Namespace) -> int:
    """``tessera gc [--older-than 1h] [--dry-run]``."""
    try:
        older_than = parse_age(args.older_than)
    except ValidationError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc
    store = await open_object_store(session.settings.object_store)
    try:
        db = await _db(session)
        try:
            progress = ProgressPointers(
                session.nc.jetstream(), session.names.bucket(n.BUCKET_PROGRESS)
            )
            garbage = await find_garbage(store, db, progress, older_than=older_than)
        finally:
            await db.close()
        if not args.dry_run:
            await collect(store, garbage)
    finally:
        await store.close()
    verb = "would delete" if args.dry_run else "deleted"
    if args.json:
        items = [{"key": g.key, "why": g.why, "age": round(g.age, 1), "size": g.size}
                 for g in garbage]  # fmt: skip
        print(orjson.dumps({"ok": True, "dry_run": args.dry_run, "objects": items}).decode())
        return EXIT_OK
    for g in garbage:
        print(f"{verb} {g.key}  ({g.why}; {g.age:.0f}s old, {g.size} bytes)")
    print(f"{verb} {len(garbage)} object(s), {sum(g.size for g in garbage)} bytes")
    return EXIT_OK


async def top(session: Session, args: argparse.Namespace) -> int:
    """``tessera top [--once] [--interval S] [--window S]``."""
    topology = topology_for(session.settings)
    js = session.nc.jetstream(timeout=5)
    db = await _db(session)
    live = sys.stdout.isatty() and not args.once
    try:
        while True:
            try:
                share = session.settings.scheduler.fair_share_window
                frame = render(
                    await snapshot(js, topology, db, window=args.window, share_window=share)
                )
            except RetryableError as exc:
                if args.once:
                    raise  # exit 4, "unavailable", with the reason
                # live: say so on screen and keep trying; the next frame may succeed
                frame = f"tessera top: no frame at {time.strftime('%H:%M:%S')}: {exc}"
            print(f"{_CLEAR if live else ''}{frame}", flush=True)
            if args.once:
                return EXIT_OK
            await asyncio.sleep(args.interval)
    finally:
        await db.close()


OPS_EPILOG = (
    "needs TESSERA_DATABASE_URL (reads PostgreSQL directly) as well as TESSERA_NATS_URL. "
    "exit status: 0 ok; 2 usage or configuration error; "
    "3 any other error; 4 unavailable (NATS, PostgreSQL or the object store unreachable)"
)


def _command(sub: Sub, name: str, action: Action, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text, epilog=OPS_EPILOG)
    p.add_argument("--timeout", type=positive_float, default=10.0, help="seconds to reach NATS")
    p.set_defaults(func=partial(_run, action))
    return p


def register(sub: Sub) -> None:
    """Add ``gc`` and ``top`` to the ``tessera`` command."""
    p = _command(sub, "gc", gc, "delete orphaned checkpoints and stale temporary objects")
    p.add_argument("--older-than", default="1h", metavar="AGE",
                   help="only objects this old or older: 90s, 15m, 1h, 2d")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, and why")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p = _command(sub, "top", top, "live view of streams, tiles in flight, rates and failures")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument(
        "--interval", type=positive_float, default=1.0, help="refresh period (default 1 s)"
    )
    p.add_argument("--window", type=positive_float, default=10.0,
                   help="seconds the tiles/s rate is measured over (default 10)")  # fmt: skip
