"""Tile rows: the plan, message publishes, bulk moves and the progress/sweeper queries.

The owner's fenced writes (lease fence, progress, commit, failure) are in
:mod:`shared.metadata.fencing`. A transaction that touches both a job and its tiles always
writes the job row first, so two of them never wait on each other in opposite orders.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from kernel.rect import Rect
from shared.core.errors import ConflictError, NotFoundError, RetryableError, ValidationError
from shared.core.lifecycle import (
    TERMINAL_TILE_STATES,
    IllegalTransition,
    JobState,
    JobTrigger,
    TileState,
    TileTrigger,
    tile_legal_events,
    transition_tile,
)
from shared.metadata import audit, jobs
from shared.metadata.audit import Conn, Who
from shared.metadata.dispatch import DISPATCHABLE
from shared.metadata.models import Tile, TileCounts, TileResultRef

_TERMINAL_TILES = [s.value for s in TERMINAL_TILE_STATES]
#: jobs whose tiles the dispatcher releases (and the sweeper re-publishes)
_DISPATCHABLE_JOBS = [s.value for s in DISPATCHABLE]


async def fetch_tile(conn: Conn, job_id: str, tile_index: int) -> Tile | None:
    """The tile, or ``None``."""
    row = await conn.fetchrow(
        "SELECT * FROM tiles WHERE job_id = $1 AND tile_index = $2", job_id, tile_index
    )
    return None if row is None else Tile.from_record(row)


async def require_tile(conn: Conn, job_id: str, tile_index: int) -> Tile:
    tile = await fetch_tile(conn, job_id, tile_index)
    if tile is None:
        raise NotFoundError(f"tile {tile_index} of job {job_id} does not exist")
    return tile


async def require_tile_and_job(
    conn: Conn, job_id: str, tile_index: int
) -> tuple[Tile, JobState, bool]:
    """The tile, its job's state and cancel flag, in one round trip (the owner's hot path)."""
    row = await conn.fetchrow(
        """
        SELECT t.*, j.state AS job_state, j.cancel_requested AS job_cancel_requested
        FROM tiles t JOIN jobs j ON j.job_id = t.job_id
        WHERE t.job_id = $1 AND t.tile_index = $2
        """,
        job_id,
        tile_index,
    )
    if row is None:
        raise NotFoundError(f"tile {tile_index} of job {job_id} does not exist")
    return Tile.from_record(row), JobState(row["job_state"]), bool(row["job_cancel_requested"])


async def list_tiles(conn: Conn, job_id: str) -> list[Tile]:
    """The job's tiles in index order."""
    rows = await conn.fetch("SELECT * FROM tiles WHERE job_id = $1 ORDER BY tile_index", job_id)
    return [Tile.from_record(row) for row in rows]


def _check_rects(rects: Sequence[tuple[int, int, int, int]]) -> list[Rect]:
    if not rects:
        raise ValidationError("plan: a job needs at least one tile")
    out = [Rect(*r) for r in rects]
    for i, r in enumerate(out):
        if min(r.x0, r.y0) < 0 or r.x1 <= r.x0 or r.y1 <= r.y0:
            raise ValidationError(f"plan: tile {i} rect {tuple(r)} is empty or negative")
    return out


async def plan(
    conn: Conn,
    job_id: str,
    rects: Sequence[tuple[int, int, int, int]],
    who: Who,
    *,
    tile_size: int | None = None,
) -> list[Tile]:
    """TILES_PLANNED and the tile rows; a second call with the same plan changes nothing.

    An unplanned job whose state does not allow TILES_PLANNED raises IllegalTransition; once
    planned, a repeat returns the plan even when the job is past planning. ``tile_size``: the
    edge ``rects`` were cut with, which a ``tile_size: "auto"`` job whose edge is not chosen yet
    takes (in this transaction, under the job's row lock); if another planner chose a different
    edge first, :class:`EdgeChosen` (retryable: planning again reads that edge).
    """
    wanted = _check_rects(rects)
    row = await conn.fetchrow(
        "SELECT state, tiles_total, tile_size FROM jobs WHERE job_id = $1 FOR UPDATE", job_id
    )
    if row is None:
        raise NotFoundError(f"job {job_id} does not exist")
    if tile_size is not None and row["tile_size"] != tile_size:
        if row["tile_size"] != 0:
            raise EdgeChosen(
                f"job {job_id}: its tile edge is {row['tile_size']}, not {tile_size} (chosen by "
                "another planner): plan it again"
            )
        await conn.execute(
            "UPDATE jobs SET tile_size = $2 WHERE job_id = $1 AND tile_size = 0", job_id, tile_size
        )
    if row["tiles_total"] not in (0, len(wanted)):
        raise ConflictError(
            f"job {job_id} is planned with {row['tiles_total']} tiles, not {len(wanted)}"
        )
    detail = Who(who.node, who.attempt_id, detail=f"{len(wanted)} tiles")
    state = JobState(row["state"])
    try:
        await jobs.cas_job(conn, job_id, state, JobTrigger.TILES_PLANNED, detail)
    except IllegalTransition:
        if row["tiles_total"] == 0:
            raise
        # Already planned, and the job has moved past planning (finalizing, completed, ...):
        # a late redelivery of the JOBS message re-reads the plan and moves nothing.
    columns = list(zip(*wanted, strict=True))
    await conn.execute(
        """
        INSERT INTO tiles (job_id, tile_index, x0, y0, x1, y1, state)
        SELECT $1, r.i - 1, r.x0, r.y0, r.x1, r.y1, $6
        FROM unnest($2::integer[], $3::integer[], $4::integer[], $5::integer[])
             WITH ORDINALITY AS r(x0, y0, x1, y1, i)
        ON CONFLICT (job_id, tile_index) DO NOTHING
        """,
        job_id,
        *columns,
        TileState.QUEUED.value,
    )
    await conn.execute("UPDATE jobs SET tiles_total = $2 WHERE job_id = $1", job_id, len(wanted))
    tiles = await list_tiles(conn, job_id)
    if [t.rect for t in tiles] != wanted:
        raise ConflictError(f"job {job_id} is already planned with different tile rectangles")
    return tiles


class EdgeChosen(RetryableError):
    """An auto job's tile edge was chosen by another planner first (plan again to use it)."""


async def mark_published(
    conn: Conn, job_id: str, tile_indexes: Sequence[int], generation: int
) -> None:
    """Record a publish of the tiles' messages (generation never goes backwards)."""
    await conn.execute(
        """
        UPDATE tiles SET published_at = now(), generation = GREATEST(generation, $3)
        WHERE job_id = $1 AND tile_index = ANY($2::integer[])
        """,
        job_id,
        list(tile_indexes),
        generation,
    )


#: tiles an operator retry sends back to the queue (derived from the tile machine)
REQUEUE_ON_RETRY = tuple(
    s for s in TileState if s != TileState.QUEUED and TileTrigger.REQUEUE in tile_legal_events(s)
)


async def unrelease_queued(conn: Conn, job_id: str, *, keep: int | None = None) -> None:
    """The job's released queued tiles (but tile ``keep``) back to unreleased (``published_at``
    NULL) under a new generation: a retry hands them to the dispatcher, and a message of theirs
    still in the stream is superseded (a worker drops it) instead of rendered outside the
    window."""
    await conn.execute(
        """
        UPDATE tiles SET published_at = NULL, generation = generation + 1
        WHERE job_id = $1 AND state = $2 AND published_at IS NOT NULL
          AND tile_index IS DISTINCT FROM $3
        """,
        job_id,
        TileState.QUEUED.value,
        keep,
    )


async def move_idle(
    conn: Conn,
    job_id: str,
    sources: Iterable[TileState],
    trigger: TileTrigger,
    who: Who,
    *,
    fresh: bool = False,
) -> list[int]:
    """Bulk-move the job's tiles in ``sources`` by ``trigger``; the moved indexes.

    ``fresh`` starts a new message generation with the errors cleared (an operator retry).
    """
    moved: list[int] = []
    for source in sources:
        target = transition_tile(source, trigger)
        rows = await conn.fetch(
            """
            UPDATE tiles SET state = $3, updated_at = now(),
                generation = generation + CASE WHEN $4 THEN 1 ELSE 0 END,
                last_error_code = CASE WHEN $4 THEN NULL ELSE last_error_code END,
                last_error = CASE WHEN $4 THEN NULL ELSE last_error END
            WHERE job_id = $1 AND state = $2
            RETURNING tile_index
            """,
            job_id,
            source.value,
            target.value,
            fresh,
        )
        indexes = sorted(r["tile_index"] for r in rows)
        if indexes:
            await audit.record_tile_events(
                conn, job_id, indexes, from_state=source, to_state=target, trigger=trigger, who=who
            )
        moved += indexes
    return sorted(moved)


async def result_lost(conn: Conn, job_id: str, tile_indexes: Sequence[int], who: Who) -> list[int]:
    """RESULT_LOST: the job back from ``finalizing`` to rendering, the ``done`` tiles among
    ``tile_indexes`` back to ``queued`` with their result forgotten; the indexes moved.

    The sweeper re-publishes such a tile (no message, no lease) after ``TESSERA_SWEEP_AGE``.
    """
    await jobs.move_job(conn, job_id, JobTrigger.RESULT_LOST, expected=JobState.FINALIZING, who=who)
    target = transition_tile(TileState.DONE, TileTrigger.RESULT_LOST)
    rows = await conn.fetch(
        """
        UPDATE tiles SET state = $4, result_key = NULL, result_sha256 = NULL, samples_done = 0,
            last_error_code = $5, last_error = $6, updated_at = now()
        WHERE job_id = $1 AND tile_index = ANY($2::integer[]) AND state = $3
        RETURNING tile_index
        """,
        job_id,
        list(tile_indexes),
        TileState.DONE.value,
        target.value,
        who.error_code,
        who.error,
    )
    moved = sorted(r["tile_index"] for r in rows)
    await conn.execute(
        "DELETE FROM tile_results WHERE job_id = $1 AND tile_index = ANY($2::integer[])",
        job_id,
        moved,
    )
    if moved:
        await audit.record_tile_events(
            conn,
            job_id,
            moved,
            from_state=TileState.DONE,
            to_state=target,
            trigger=TileTrigger.RESULT_LOST,
            who=who,
        )
    return moved


async def counts(conn: Conn, job_id: str) -> TileCounts:
    """Per-state counts and the sum of ``samples_done`` (zeros for an unplanned job)."""
    rows = await conn.fetch(
        """
        SELECT state, count(*) AS n, COALESCE(sum(samples_done), 0) AS samples
        FROM tiles WHERE job_id = $1 GROUP BY state
        """,
        job_id,
    )
    by_state = dict.fromkeys(TileState, 0) | {TileState(r["state"]): r["n"] for r in rows}
    return TileCounts(
        total=sum(by_state.values()),
        done=by_state[TileState.DONE],
        by_state=by_state,
        samples_done=sum(int(r["samples"]) for r in rows),
    )


# A literal (not a parameter), so the planner can match the partial index's predicate.
_ALL_DONE = f"""
SELECT j.tiles_total > 0 AND NOT EXISTS
       (SELECT 1 FROM tiles t WHERE t.job_id = j.job_id AND t.state <> '{TileState.DONE.value}')
FROM jobs j WHERE j.job_id = $1
"""


async def all_done(conn: Conn, job_id: str) -> bool:
    """True once the job is planned and every one of its tiles is ``done``.

    One probe into the partial index ``tiles_not_done`` (the job's open tiles), not a count
    over every tile: the finalizer asks on every tile-done event.
    """
    value = await conn.fetchval(_ALL_DONE, job_id)
    if value is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return bool(value)


_COMPLETED_BY = f"""
SELECT j.job_id,
       CASE WHEN j.tiles_total > 0 AND NOT EXISTS
         (SELECT 1 FROM tiles t WHERE t.job_id = j.job_id AND t.state <> '{TileState.DONE.value}')
       THEN (SELECT max(t.lease_fence) FROM tiles t WHERE t.job_id = j.job_id) END AS completion
FROM jobs j WHERE j.job_id = ANY($1::text[])
"""


async def completed_by(conn: Conn, job_id: str) -> int | None:
    """None while the job is unplanned or a tile is not ``done``; else the newest
    ``lease_fence`` among its tiles, which names this completion (a tile rendered again after
    its result was lost commits under a newer fence, so the next completion has a new name).

    The worker asks after a commit it announces (unless another of its runs owns an
    unfinished tile of the job, whose commit will ask: ``services.worker.context.Questions``):
    the commit that completes a job is seen by the question asked after it, so the last of
    several concurrent commits always sees all.
    """
    (answer,) = await completed_by_many(conn, [job_id])
    if isinstance(answer, NotFoundError):
        raise answer
    return answer


async def completed_by_many(conn: Conn, job_ids: Sequence[str]) -> list[int | NotFoundError | None]:
    """:func:`completed_by` of each job in one statement, in order (a job may be named more
    than once: the answer is the same); a :class:`NotFoundError` for a job that does not exist.

    One snapshot for all, taken when the statement runs: after every commit whose worker asked
    before it was sent, which is all the question needs.
    """
    rows = await conn.fetch(_COMPLETED_BY, list(set(job_ids)))
    found = {row["job_id"]: row["completion"] for row in rows}
    return [
        (None if found[j] is None else int(found[j]))
        if j in found
        else NotFoundError(f"job {j} does not exist")
        for j in job_ids
    ]


#: job states that move to ``finalizing`` once every tile is done, with nothing else pending
#: (``failed_retryable`` is left out: its finalization is being retried under a bound)
_FINALIZABLE = [JobState.RUNNING.value, JobState.PROGRESSING.value, JobState.PAUSED.value]

_UNFINALIZED = f"""
WITH complete AS MATERIALIZED (
  SELECT j.job_id FROM jobs j
  WHERE j.state = ANY($1::text[]) AND j.tiles_total > 0 AND NOT j.cancel_requested
    AND NOT EXISTS (SELECT 1 FROM tiles t
                    WHERE t.job_id = j.job_id AND t.state <> '{TileState.DONE.value}')
  ORDER BY j.job_id LIMIT $3
)
SELECT c.job_id, max(t.lease_fence) AS completion
FROM complete c JOIN tiles t ON t.job_id = c.job_id
GROUP BY c.job_id
HAVING max(t.updated_at) < now() - make_interval(secs => $2)
ORDER BY c.job_id
"""


async def unfinalized(conn: Conn, *, older_than: float, limit: int) -> list[tuple[str, int]]:
    """``(job_id, completion)`` of jobs whose every tile has been done for more than
    ``older_than`` seconds but that no finalizer has taken (still running, progressing or
    paused): their tiles-done event was lost. ``completion`` as :func:`completed_by`."""
    rows = await conn.fetch(_UNFINALIZED, _FINALIZABLE, older_than, limit)
    return [(r["job_id"], int(r["completion"])) for r in rows]


async def result_refs(conn: Conn, job_id: str) -> list[TileResultRef]:
    """Where each of the job's tiles' results is, in index order."""
    rows = await conn.fetch(
        "SELECT tile_index, x0, y0, x1, y1, result_key, result_sha256 FROM tiles"
        " WHERE job_id = $1 ORDER BY tile_index",
        job_id,
    )
    return [TileResultRef(r[0], Rect(r[1], r[2], r[3], r[4]), r[5], r[6]) for r in rows]


async def inline_results(conn: Conn, job_id: str) -> dict[int, tuple[str, bytes]]:
    """``tile_index -> (sha256, data)`` of the job's results stored inline."""
    rows = await conn.fetch(
        "SELECT tile_index, sha256, data FROM tile_results WHERE job_id = $1", job_id
    )
    return {row["tile_index"]: (row["sha256"], bytes(row["data"])) for row in rows}


# A tile is stale once its message was published ``older_than`` s ago. Only released tiles
# (``published_at`` set) of dispatchable jobs: an unreleased tile waits for the dispatcher by
# design, and a paused, cancel-requested or overdue job's tiles are not to run.
_STALE = """
    j.state = ANY($1::text[]) AND NOT j.cancel_requested
    AND (j.deadline_at IS NULL OR j.deadline_at > now())
    AND t.state <> ALL($2::text[])
    AND t.published_at < now() - make_interval(secs => $3)
"""


StaleKey = tuple[datetime | None, str, int]
"""Where a tile stands in :func:`stale`'s order: publish time, job id, tile index."""


def stale_key(tile: Tile) -> StaleKey:
    """``tile``'s place in :func:`stale`'s order, for its ``after`` cursor."""
    return (tile.published_at, tile.job_id, tile.tile_index)


async def stale(
    conn: Conn, *, older_than: float, limit: int, after: StaleKey | None = None
) -> list[Tile]:
    """Released open tiles of dispatchable jobs whose message was last published
    ``older_than`` s ago; oldest publish first, and only those
    past ``after`` in that order (a cursor: a sweep pages through a backlog larger than
    ``limit`` instead of looking at its oldest page again and again)."""
    published, job_id, index = after if after is not None else (None, "", -1)
    rows = await conn.fetch(
        f"""
        SELECT t.* FROM tiles t JOIN jobs j ON j.job_id = t.job_id
        WHERE {_STALE}
          AND (NOT $8::boolean
               OR ($5::timestamptz IS NULL
                   AND (t.published_at IS NOT NULL OR (t.job_id, t.tile_index) > ($6, $7)))
               OR t.published_at > $5
               OR (t.published_at = $5 AND (t.job_id, t.tile_index) > ($6, $7)))
        ORDER BY t.published_at NULLS FIRST, t.job_id, t.tile_index
        LIMIT $4
        """,
        _DISPATCHABLE_JOBS,
        _TERMINAL_TILES,
        older_than,
        limit,
        published,
        job_id,
        index,
        after is not None,
    )
    return [Tile.from_record(row) for row in rows]


async def claim_lost(conn: Conn, seen: Sequence[Tile], *, older_than: float) -> list[Tile]:
    """The sweeper's re-check and generation bump, one statement: the claimed tiles.

    A tile of ``seen`` (as the sweeper read it) is claimed only if it is still stale by
    :func:`stale`'s rule (open tile, live job) and its row has not changed since it was read
    (same ``updated_at``, ``lease_fence``, ``generation`` and ``published_at``: no fence,
    progress, commit or publish in between). A claimed tile gets ``generation + 1`` and
    ``published_at = now()``. A concurrent commit holds the row lock; the statement then
    re-checks the committed row and skips it, so "still not done" and the bump are atomic.
    """
    if not seen:
        return []
    rows = await conn.fetch(
        f"""
        UPDATE tiles t SET generation = t.generation + 1, published_at = now()
        FROM jobs j,
             unnest($4::text[], $5::integer[], $6::timestamptz[], $7::bigint[], $8::integer[],
                    $9::timestamptz[])
               AS s(job_id, tile_index, updated_at, lease_fence, generation, published_at)
        WHERE t.job_id = s.job_id AND t.tile_index = s.tile_index AND j.job_id = t.job_id
          AND t.updated_at = s.updated_at AND t.lease_fence = s.lease_fence
          AND t.generation = s.generation
          AND t.published_at IS NOT DISTINCT FROM s.published_at
          AND {_STALE}
        RETURNING t.*
        """,
        _DISPATCHABLE_JOBS,
        _TERMINAL_TILES,
        older_than,
        [t.job_id for t in seen],
        [t.tile_index for t in seen],
        [t.updated_at for t in seen],
        [t.lease_fence for t in seen],
        [t.generation for t in seen],
        [t.published_at for t in seen],
    )
    claimed = [Tile.from_record(row) for row in rows]
    return sorted(claimed, key=lambda t: (t.job_id, t.tile_index))
