"""How a job looks in a reply: the schemas of :mod:`proto.api_replies`, times as ISO 8601."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TypeVar, overload

import orjson

from proto.api_replies import JobSummary, StatusReply
from proto.limits import MAX_REPLY_BYTES
from shared.metadata.models import Job, TileCounts

__all__ = ["iso", "job_status", "job_summary", "within_budget"]

V = TypeVar("V")


@overload
def iso(at: datetime) -> str: ...
@overload
def iso(at: datetime | None) -> str | None: ...
def iso(at: datetime | None) -> str | None:
    """A timestamp as the API writes it: ISO 8601 with its UTC offset."""
    return None if at is None else at.isoformat()


def job_summary(job: Job) -> JobSummary:
    """The short form used by ``list``: identity, state, size, times."""
    return JobSummary(
        job_id=job.job_id,
        project=job.project,
        state=job.state.value,
        frame=job.frame,
        width=job.width,
        height=job.height,
        spp=job.spp,
        generation=job.generation,
        created_at=iso(job.created_at),
        updated_at=iso(job.updated_at),
        finished_at=iso(job.finished_at),
        priority=job.priority,
        deadline_at=iso(job.deadline_at),
        renderer=job.renderer,
    )


def job_status(job: Job, counts: TileCounts, waiting: str | None = None) -> StatusReply:
    """Everything ``status`` reports: the summary, progress, result and last error, and why
    its tiles wait (``waiting``, see :meth:`~services.gateway.handlers.Handlers.status`)."""
    tiles_total = counts.total or job.tiles_total
    return StatusReply(
        **vars(job_summary(job)),
        idempotency_key=job.idempotency_key,
        input_hash=job.input_hash,
        tile_size=job.tile_size,
        tile_auto=job.tile_auto,
        tiles_total=tiles_total,
        tiles_done=counts.done,
        tiles_by_state={state.value: n for state, n in counts.by_state.items() if n},
        samples_total=job.spp * tiles_total,
        samples_done=counts.samples_done,
        cancel_requested=job.cancel_requested,
        result_location=job.result_location,
        result_sha256=job.result_sha256,
        float_location=job.float_location,
        last_error_code=job.last_error_code,
        last_error=job.last_error,
        waiting=waiting,
    )


def within_budget(views: Iterable[V], budget: int = MAX_REPLY_BYTES) -> list[V]:
    """The leading ``views`` (reply schemas or dicts) whose JSON fits in ``budget`` bytes.

    At least one is kept, if any: a reply made of them stays below NATS's ``max_payload``,
    however long their texts are.
    """
    kept: list[V] = []
    used = 0
    for view in views:
        used += len(orjson.dumps(view)) + 1
        if kept and used > budget:
            break
        kept.append(view)
    return kept
