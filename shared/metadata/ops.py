"""Operator queries and the one-tile requeue: ``MetadataStore.ops``, on the store's pool.

:meth:`OpsStore.requeue_tile` is the metadata half of ``tessera dlq requeue`` for one tile; the
rest are read-only queries for ``tessera gc`` and ``tessera top``, each bounded (a ``LIMIT`` or
a window over the newest audit rows) so an operator tool polling every second stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from shared.core.lifecycle import (
    IllegalTransition,
    JobState,
    TileState,
    TileTrigger,
    transition_tile,
)
from shared.metadata import audit, jobs, tiles
from shared.metadata.audit import Conn, Who
from shared.metadata.base import StoreBase
from shared.metadata.jobs import CasMiss
from shared.metadata.models import AuditEvent, Job, Tile

__all__ = ["InFlightTile", "OpsStore", "TileRequeue"]

#: a dead-lettered or terminally failed tile is what an operator requeue brings back
REQUEUEABLE = (TileState.DEAD_LETTERED, TileState.FAILED_TERMINAL)
_RETRYABLE_JOB = (JobState.DEAD_LETTERED, JobState.FAILED_TERMINAL)
#: how many of the newest audit rows ``top``'s rates and failures look at, at most
AUDIT_WINDOW = 10_000


@dataclass(frozen=True)
class TileRequeue:
    """What :meth:`OpsStore.requeue_tile` did: the rows afterwards, and if the job moved too."""

    job: Job
    tile: Tile
    job_requeued: bool


@dataclass(frozen=True)
class InFlightTile:
    """A tile some worker holds (``leased`` or ``progressing``), for ``tessera top``."""

    job_id: str
    tile_index: int
    state: TileState
    samples_done: int
    spp: int
    lease_fence: int
    updated_at: datetime


class OpsStore:
    """The operator methods of the metadata store, on the store's pool and transaction runner
    (``store.ops``, not a base class of the store)."""

    def __init__(self, db: StoreBase) -> None:
        self._db = db

    async def requeue_tile(self, job_id: str, tile_index: int, *, node: str = "") -> TileRequeue:
        """REQUEUE one dead-lettered/failed tile (generation + 1, errors cleared), in one
        transaction with its job: a job in ``dead_lettered``/``failed_terminal`` is RETRYed
        back to ``queued`` (generation + 1); a live job is left as it is. Both moves are
        audited. A tile in any other state, or a completed/cancelled job, raises
        :class:`~shared.core.lifecycle.IllegalTransition` and changes nothing."""
        who = Who(node, detail="dlq requeue")
        return await self._db._tx("requeue_tile", lambda c: _requeue(c, job_id, tile_index, who))

    async def job_tile_states(
        self, job_ids: Sequence[str]
    ) -> dict[str, tuple[JobState, dict[int, TileState]]]:
        """For ``gc``: each existing job's state and its tiles' states (missing jobs absent)."""
        return await self._db._read("job_tile_states", lambda c: _states(c, list(job_ids)))

    async def in_flight_tiles(self, *, limit: int = 50) -> list[InFlightTile]:
        """Tiles in ``leased``/``progressing``, least recently updated first."""
        return await self._db._read("in_flight_tiles", lambda c: _in_flight(c, limit))

    async def recent_failures(self, *, limit: int = 10) -> list[AuditEvent]:
        """The newest audit rows that carry an error code, newest first."""
        query = """
            SELECT * FROM (SELECT * FROM job_events ORDER BY id DESC LIMIT $1) e
            WHERE e.error_code IS NOT NULL ORDER BY e.id DESC LIMIT $2
        """
        rows = await self._db._read(
            "recent_failures", lambda c: c.fetch(query, AUDIT_WINDOW, limit)
        )
        return [AuditEvent.from_record(r) for r in rows]

    async def tiles_committed_since(self, seconds: float) -> int:
        """Tile commits audited in the last ``seconds`` (within the newest audit rows)."""
        query = """
            SELECT count(*) FROM (SELECT at, trigger, entity FROM job_events
                                  ORDER BY id DESC LIMIT $1) e
            WHERE e.entity = 'tile' AND e.trigger = $2 AND e.at > now() - make_interval(secs => $3)
        """
        value = await self._db._read(
            "tiles_committed_since",
            lambda c: c.fetchval(query, AUDIT_WINDOW, TileTrigger.COMMIT.value, seconds),
        )
        return int(value or 0)

    async def job_state_counts(self) -> dict[JobState, int]:
        """How many jobs are in each state."""
        query = "SELECT state, count(*) AS n FROM jobs GROUP BY state"
        rows = await self._db._read("job_state_counts", lambda c: c.fetch(query))
        return {JobState(r["state"]): int(r["n"]) for r in rows}


async def _requeue(conn: Conn, job_id: str, tile_index: int, who: Who) -> TileRequeue:
    job = await jobs.require_job(conn, job_id)
    tile = await _tile(conn, job_id, tile_index)
    if tile.state not in REQUEUEABLE:
        raise IllegalTransition(
            f"tile {tile_index} of job {job_id} is {tile.state.value}: only a dead-lettered or "
            "failed_terminal tile can be requeued"
        )
    target = transition_tile(tile.state, TileTrigger.REQUEUE)
    moved_job = job.state in _RETRYABLE_JOB
    if moved_job:
        await jobs.retry(conn, job_id, who)  # the job row first (lock order)
    elif job.state in (JobState.COMPLETED, JobState.CANCELLED):
        raise IllegalTransition(f"job {job_id} is {job.state.value}: its tiles stay as they are")
    row = await conn.fetchrow(
        """
        UPDATE tiles SET state = $4, generation = generation + 1, last_error_code = NULL,
            last_error = NULL, updated_at = now(), published_at = now()
        WHERE job_id = $1 AND tile_index = $2 AND state = $3
        RETURNING *
        """,
        job_id,
        tile_index,
        tile.state.value,
        target.value,
    )
    if row is None:
        raise CasMiss
    await audit.record_event(
        conn, job_id, tile_index=tile_index, from_state=tile.state, to_state=target,
        trigger=TileTrigger.REQUEUE, who=who,
    )  # fmt: skip
    if moved_job:
        # The job runs again, as after a retry: its other failed or dead-lettered tiles (a
        # dead-lettered job's in-flight tiles end failed_terminal) are requeued too, and its
        # queued ones unreleased, for the dispatcher to release under a new generation (the
        # planner writes rows only; nothing else would publish them). This tile is published
        # by the requeue itself.
        await tiles.move_idle(
            conn, job_id, tiles.REQUEUE_ON_RETRY, TileTrigger.REQUEUE, who, fresh=True
        )
        await tiles.unrelease_queued(conn, job_id, keep=tile_index)
    return TileRequeue(await jobs.require_job(conn, job_id), Tile.from_record(row), moved_job)


async def _tile(conn: Conn, job_id: str, tile_index: int) -> Tile:
    row = await conn.fetchrow(
        "SELECT * FROM tiles WHERE job_id = $1 AND tile_index = $2", job_id, tile_index
    )
    if row is None:
        raise IllegalTransition(f"tile {tile_index} of job {job_id} does not exist")
    return Tile.from_record(row)


async def _states(
    conn: Conn, job_ids: list[str]
) -> dict[str, tuple[JobState, dict[int, TileState]]]:
    rows = await conn.fetch(
        """
        SELECT j.job_id, j.state AS job_state, t.tile_index, t.state AS tile_state
        FROM jobs j LEFT JOIN tiles t ON t.job_id = j.job_id
        WHERE j.job_id = ANY($1::text[])
        """,
        job_ids,
    )
    out: dict[str, tuple[JobState, dict[int, TileState]]] = {}
    for r in rows:
        _, tiles = out.setdefault(r["job_id"], (JobState(r["job_state"]), {}))
        if r["tile_index"] is not None:
            tiles[r["tile_index"]] = TileState(r["tile_state"])
    return out


async def _in_flight(conn: Conn, limit: int) -> list[InFlightTile]:
    rows = await conn.fetch(
        """
        SELECT t.job_id, t.tile_index, t.state, t.samples_done, j.spp, t.lease_fence,
               t.updated_at
        FROM tiles t JOIN jobs j ON j.job_id = t.job_id
        WHERE t.state = ANY($1::text[])
        ORDER BY t.updated_at LIMIT $2
        """,
        [TileState.LEASED.value, TileState.PROGRESSING.value],
        limit,
    )
    return [
        InFlightTile(r["job_id"], r["tile_index"], TileState(r["state"]), r["samples_done"],
                     r["spp"], r["lease_fence"], r["updated_at"])
        for r in rows
    ]  # fmt: skip
