"""``tessera dlq requeue``: plan with a dry run, then requeue at a bounded rate.

The gateway paces requeues (``--rate`` per second) and replies when all are done, so the
command first asks for a dry run — which also bounds the real run to the letters it listed —
and then waits ``count / rate`` seconds plus ``--timeout`` for the real reply.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import orjson

from proto.limits import DEFAULT_REQUEUE_RATE
from services.client.api import TesseraClient
from services.client.argtypes import positive_int
from services.client.session import EXIT_OK, Session

__all__ = ["dlq_requeue", "parse_rate", "requeue_table"]


def parse_rate(raw: str) -> int:
    """``10`` or ``10/s`` as requeues per second (a whole number >= 1)."""
    try:
        return positive_int(raw.strip().removesuffix("/s"))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a rate: N or N/s, N >= 1") from None


def requeue_table(reply: dict[str, Any]) -> str:
    """One line per dead letter: sequence, job, unit, action, why, and the letter's reason."""
    lines = []
    for d in reply["dead_letters"]:
        verb = d["action"] if d["done"] or d["action"] == "skip" or reply["dry_run"] else "failed"
        tile = "" if d["tile"] is None else f" tile {d['tile']}"
        lines.append(
            f"{d['seq']:>6}  {d['job_id']}{tile}  {verb:<7}  {d['why']}"
            f"  [dead-lettered: {d['reason']}: {d['error'][:120]}]"
        )
    if reply.get("omitted"):
        lines.append(f"... and {reply['omitted']} more dead letter(s), not listed (reply size)")
    if reply.get("missing"):
        missing = ", ".join(map(str, reply["missing"]))
        lines.append(f"not dead letters (any more): {missing}")
    total = "would requeue" if reply["dry_run"] else "requeued"
    lines.append(f"{total} {reply['requeued']}, skipped {reply['skipped']}")
    return "\n".join(lines)


async def dlq_requeue(session: Session, args: argparse.Namespace) -> int:
    """``tessera dlq requeue [--job J] [--seq N]... [--dry-run] [--rate N/s] [--limit N]``."""
    client, seqs = session.client, args.seq
    plan = await client.dlq_requeue(job_id=args.job, dry_run=True, rate=args.rate,
                                    limit=args.limit, seqs=seqs)  # fmt: skip
    reply = plan | {"dry_run": args.dry_run}
    if not args.dry_run and plan["requeued"]:
        rate = args.rate or DEFAULT_REQUEUE_RATE
        patient = TesseraClient(
            session.nc, session.names, timeout=client.timeout + math.ceil(plan["requeued"] / rate)
        )
        # the letters the plan looked at (an older gateway lists them all and has no count)
        walked = plan.get("examined", len(plan["dead_letters"]))
        reply = await patient.dlq_requeue(job_id=args.job, rate=args.rate, limit=walked,
                                          seqs=seqs)  # fmt: skip
    if args.json:
        print(orjson.dumps({"ok": True, **reply}).decode(), flush=True)
    else:
        print(requeue_table(reply), flush=True)
    return EXIT_OK
