"""How a job looks in a reply: plain JSON fields, times as ISO 8601 strings."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import orjson

from proto.limits import MAX_REPLY_BYTES
from shared.metadata.models import Job, TileCounts

__all__ = ["job_status", "job_summary", "within_budget"]


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def job_summary(job: Job) -> dict[str, Any]:
    """The short form used by ``list``: identity, state, size, times."""
    return {
        "job_id": job.job_id,
        "project": job.project,
        "state": job.state.value,
        "frame": job.frame,
        "width": job.width,
        "height": job.height,
        "spp": job.spp,
        "generation": job.generation,
        "created_at": _iso(job.created_at),
        "updated_at": _iso(job.updated_at),
        "finished_at": _iso(job.finished_at),
    }


def job_status(job: Job, counts: TileCounts) -> dict[str, Any]:
    """Everything ``status`` reports: the summary, progress, result and last error.

    Before the scheduler has planned the tiles, ``tiles_total`` is 0. ``samples_done`` is the
    sum of the tiles' ``samples_done`` (samples per pixel each tile has finished), so
    ``samples_total`` is ``spp * tiles_total`` in the same unit.
    """
    return job_summary(job) | {
        "idempotency_key": job.idempotency_key,
        "input_hash": job.input_hash,
        "tile_size": job.tile_size,
        "tiles_total": counts.total or job.tiles_total,
        "tiles_done": counts.done,
        "tiles_by_state": {state.value: n for state, n in counts.by_state.items() if n},
        "samples_total": job.spp * (counts.total or job.tiles_total),
        "samples_done": counts.samples_done,
        "cancel_requested": job.cancel_requested,
        "result_location": job.result_location,
        "result_sha256": job.result_sha256,
        "float_location": job.float_location,
        "last_error_code": job.last_error_code,
        "last_error": job.last_error,
    }


def within_budget(
    views: Iterable[dict[str, Any]], budget: int = MAX_REPLY_BYTES
) -> list[dict[str, Any]]:
    """The leading ``views`` whose JSON fits in ``budget`` bytes (at least one, if any).

    A reply made of them stays below NATS's ``max_payload``, however long their texts are.
    """
    kept: list[dict[str, Any]] = []
    used = 0
    for view in views:
        used += len(orjson.dumps(view)) + 1
        if kept and used > budget:
            break
        kept.append(view)
    return kept
