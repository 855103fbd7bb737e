"""The console's read-only queries: ``MetadataStore.console``, on the store's pool.

What the gateway's console verbs (``job.tiles``, ``job.timeline``, ``job.preview``, ``farm``)
read: a job without its scene document, its tiles with their counts from the audit trail
(attempts, takeovers, resumes, the node holding each now), a page of its audit trail, the inline
results of some of its tiles, and the farm's numbers over a window of attempts. Each read is one
statement, bounded by the job (its tiles, its rows) or by a window over an index, so a page
polling every second stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.errors import NotFoundError
from shared.core.lifecycle import TileState, TileTrigger
from shared.metadata import jobs
from shared.metadata.audit import ABANDONED, Conn
from shared.metadata.base import StoreBase
from shared.metadata.models import AttemptOutcome, AuditEvent, Job

__all__ = ["TILE_ERROR_CHARS", "TIMELINE_ERROR_CHARS", "ConsoleStore", "FarmAudit", "TileRow"]

#: a tile's ``last_error`` in ``job.tiles`` is cut to this many characters
TILE_ERROR_CHARS = 200
#: an audit row's ``error`` in ``job.timeline`` is cut to this many characters
TIMELINE_ERROR_CHARS = 500
_HELD = (TileState.LEASED.value, TileState.PROGRESSING.value)


@dataclass(frozen=True)
class TileRow:
    """One tile as the console shows it: its row, its counts and who holds it now."""

    tile_index: int
    x0: int
    y0: int
    x1: int
    y1: int
    state: TileState
    samples_done: int
    #: attempts started (one per lease taken)
    attempts: int
    #: leases taken from owners whose attempts were still open (audit rows ``lease_expired``)
    takeovers: int
    #: attempts that resumed from a checkpoint (``resumed_from > 0``)
    resumes: int
    last_error_code: str | None
    #: cut to :data:`TILE_ERROR_CHARS`
    last_error: str | None
    #: the node of the open attempt under the tile's fence, if it is leased or progressing
    node: str | None


@dataclass(frozen=True)
class FarmAudit:
    """Counts over the attempts that ended within a window (``farm``)."""

    tile_attempts: int
    retryable: int
    fenced: int
    resumed: int
    lease_lost: int
    final_failures: int
    #: seconds of the attempts that ended ``done``, lease to commit: p50, p95, p99 (None: none)
    latency: tuple[float | None, float | None, float | None]


_TILES = f"""
SELECT t.tile_index, t.x0, t.y0, t.x1, t.y1, t.state, t.samples_done, t.last_error_code,
       left(t.last_error, {TILE_ERROR_CHARS}) AS last_error,
       coalesce(a.attempts, 0) AS attempts, coalesce(a.resumes, 0) AS resumes,
       coalesce(e.takeovers, 0) AS takeovers,
       CASE WHEN t.state = ANY($4::text[]) THEN
           (SELECT h.node FROM attempts h
            WHERE h.job_id = t.job_id AND h.tile_index = t.tile_index AND h.ended_at IS NULL
              AND h.fence = t.lease_fence
            ORDER BY h.started_at DESC LIMIT 1)
       END AS node
FROM tiles t
LEFT JOIN (SELECT tile_index, count(*) AS attempts,
                  count(*) FILTER (WHERE resumed_from > 0) AS resumes
           FROM attempts WHERE job_id = $1 AND kind = 'tile' GROUP BY tile_index) a
       ON a.tile_index = t.tile_index
LEFT JOIN (SELECT tile_index, count(*) AS takeovers FROM job_events
           WHERE job_id = $1 AND entity = 'tile' AND trigger = '{TileTrigger.LEASE.value}'
             AND error_code = '{ABANDONED}'
           GROUP BY tile_index) e
       ON e.tile_index = t.tile_index
WHERE t.job_id = $1 AND t.tile_index >= $2
ORDER BY t.tile_index
LIMIT $3
"""

_EVENT_COLUMNS = (
    "id, job_id, tile_index, attempt_id, node, entity, from_state, to_state, trigger, "
    f"error_code, left(error, {TIMELINE_ERROR_CHARS}) AS error, detail, at"
)

# Attempts that ended in the window: tile ones by the partial index attempts_ended, final ones
# by attempts_final_ended (migration 0006).
_FARM = f"""
WITH t AS (
    SELECT outcome, resumed_from,
           extract(epoch FROM ended_at - started_at)::float8 AS seconds
    FROM attempts
    WHERE kind = 'tile' AND ended_at > now() - make_interval(secs => $1)
), f AS (
    SELECT outcome FROM attempts
    WHERE kind = 'final' AND ended_at > now() - make_interval(secs => $1)
)
SELECT (SELECT count(*) FROM t) AS tile_attempts,
       (SELECT count(*) FROM t WHERE outcome = '{AttemptOutcome.RETRYABLE.value}') AS retryable,
       (SELECT count(*) FROM t WHERE outcome = '{AttemptOutcome.FENCED.value}') AS fenced,
       (SELECT count(*) FROM t WHERE resumed_from > 0) AS resumed,
       (SELECT count(*) FROM t WHERE outcome = '{AttemptOutcome.LEASE_LOST.value}')
         + (SELECT count(*) FROM f WHERE outcome = '{AttemptOutcome.LEASE_LOST.value}')
         AS lease_lost,
       (SELECT count(*) FROM f WHERE outcome <> '{AttemptOutcome.DONE.value}') AS final_failures,
       (SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY seconds)
        FROM t WHERE outcome = '{AttemptOutcome.DONE.value}') AS latency
"""


class ConsoleStore:
    """The console's queries, on the store's pool (``store.console``)."""

    def __init__(self, db: StoreBase) -> None:
        self._db = db

    async def job(self, job_id: str) -> Job:
        """The job without its scene document (an empty one), or :class:`NotFoundError`."""
        job = await self._db._read("console_job", lambda c: jobs.fetch_job_light(c, job_id))
        if job is None:
            raise NotFoundError(f"job {job_id} does not exist")
        return job

    async def tiles(self, job_id: str, *, offset: int = 0, limit: int = 20_000) -> list[TileRow]:
        """The job's tiles from index ``offset`` on, at most ``limit``, with their counts."""
        return await self._db._read("console_tiles", lambda c: _tiles(c, job_id, offset, limit))

    async def timeline(
        self, job_id: str, *, limit: int, before_id: int | None = None
    ) -> list[AuditEvent]:
        """At most ``limit`` of the job's audit rows older than ``before_id``, newest first
        (``error`` cut to :data:`TIMELINE_ERROR_CHARS`)."""
        query = f"""
            SELECT {_EVENT_COLUMNS} FROM job_events
            WHERE job_id = $1 AND ($2::bigint IS NULL OR id < $2::bigint)
            ORDER BY id DESC LIMIT $3
        """
        rows = await self._db._read(
            "console_timeline", lambda c: c.fetch(query, job_id, before_id, limit)
        )
        return [AuditEvent.from_record(r) for r in rows]

    async def inline_results(
        self, job_id: str, tile_indexes: Sequence[int]
    ) -> dict[int, tuple[str, bytes]]:
        """``tile_index -> (sha256, data)`` of those of ``tile_indexes`` stored inline."""
        query = """
            SELECT tile_index, sha256, data FROM tile_results
            WHERE job_id = $1 AND tile_index = ANY($2::integer[])
        """
        rows = await self._db._read(
            "console_inline_results", lambda c: c.fetch(query, job_id, list(tile_indexes))
        )
        return {r["tile_index"]: (r["sha256"], bytes(r["data"])) for r in rows}

    async def farm(self, *, window: float) -> FarmAudit:
        """Counts and latency percentiles of the attempts that ended in the last ``window`` s."""
        row = await self._db._read("console_farm", lambda c: c.fetchrow(_FARM, float(window)))
        assert row is not None  # an aggregate always returns its row
        p50, p95, p99 = row["latency"] or (None, None, None)
        return FarmAudit(
            tile_attempts=int(row["tile_attempts"]),
            retryable=int(row["retryable"]),
            fenced=int(row["fenced"]),
            resumed=int(row["resumed"]),
            lease_lost=int(row["lease_lost"]),
            final_failures=int(row["final_failures"]),
            latency=(p50, p95, p99),
        )


async def _tiles(conn: Conn, job_id: str, offset: int, limit: int) -> list[TileRow]:
    rows = await conn.fetch(_TILES, job_id, offset, limit, list(_HELD))
    return [
        TileRow(
            tile_index=r["tile_index"],
            x0=r["x0"],
            y0=r["y0"],
            x1=r["x1"],
            y1=r["y1"],
            state=TileState(r["state"]),
            samples_done=r["samples_done"],
            attempts=int(r["attempts"]),
            takeovers=int(r["takeovers"]),
            resumes=int(r["resumes"]),
            last_error_code=r["last_error_code"],
            last_error=r["last_error"],
            node=r["node"],
        )
        for r in rows
    ]
