"""The owner's two hot writes, one statement each: the lease fence and the fenced commit.

Each statement writes the tile's side of its move in one round trip, atomic on its own: the
tile row's compare-and-set, the attempt row and the audit row (and the commit's inline result).
They are the only code that writes these rows, and there are two owners of the cases:

- the statement alone (:func:`fence`, :func:`commit`) owns the case every tile of a running job
  goes through: a tile never leased before (no takeover to explain, no checkpoint to resume) of
  a job in a state where TILE_STARTED / TILE_PROGRESS write nothing, fenced under the caller's
  token. Its guards are the lifecycle tables, passed as parameters (never states written in
  SQL), so anything else matches no row: it declines having written nothing, and the caller
  runs the transaction. The fence needs no read before it: it returns the tile row as it was,
  fenced or not, so the worker decides from that row what a declined copy needs;
- the transaction (:mod:`shared.metadata.fencing`) owns every other case: it reads fresh rows,
  refuses, moves the job, names the attempts a takeover supersedes, and then runs the same
  statement (:func:`write_lease`, :func:`write_commit`) guarded by exactly what it read.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncpg import Record

from shared.core.lifecycle import (
    IllegalTransition,
    JobState,
    JobTrigger,
    TileState,
    TileTrigger,
    is_terminal,
    transition_job,
    transition_tile,
)
from shared.metadata.audit import EVENT_COLUMNS, Conn
from shared.metadata.models import FirstFence, Tile, TileCommit, TileFence


def quiet_job_states(trigger: JobTrigger) -> list[JobState]:
    """Live job states that ``trigger`` leaves unchanged (no job row to write)."""
    quiet = []
    for state in JobState:
        try:
            if not is_terminal(state) and transition_job(state, trigger) == state:
                quiet.append(state)
        except IllegalTransition:
            continue
    return quiet


def _moves(trigger: TileTrigger) -> list[tuple[TileState, TileState]]:
    """``(from, to)`` of every tile state ``trigger`` is legal in."""
    moves = []
    for state in TileState:
        try:
            moves.append((state, transition_tile(state, trigger)))
        except IllegalTransition:
            continue
    return moves


_STARTED_QUIET = quiet_job_states(JobTrigger.TILE_STARTED)
_PROGRESS_QUIET = quiet_job_states(JobTrigger.TILE_PROGRESS)
_COMMIT_MOVES = _moves(TileTrigger.COMMIT)
_LEASE_MOVES = _moves(TileTrigger.LEASE)

#: no generation bound (the transaction decides from the rows it read, the generation aside)
ANY_GENERATION = 2**31 - 1

# Both statements take their tiles as parallel arrays (``unnest``): one tile or a batch of them
# (the store's group commit, :mod:`shared.metadata.coalesce`) is the same statement, each tile
# guarded on its own row exactly as if it were alone. A batch never names a tile twice.
#
# ``cur`` is the row as the statement's snapshot has it; the update re-checks ``t.state =
# cur.state`` on the row it locks, so a tile that moved meanwhile (READ COMMITTED re-reads a row
# updated under it) matches nothing, and the audit row's from-state is the one it moved from.
#
# The fence finds each tile and its job by key, one lookup per tile whatever the statistics say
# (``LATERAL ... OFFSET 0``: a subquery run per argument row, on the primary key), and updates
# the very row version it read (``t.ctid = cur.row_id``; a version updated meanwhile is not that
# version, so the tile matches nothing and the transaction decides). The pool plans each
# statement once (``plan_cache_mode = force_generic_plan``), on the statistics of that moment:
# a join the planner was free to order scanned every tile of the job per argument row (the
# index on ``job_id`` alone) or the whole table once (a hash join, when ``tiles`` looked small
# at planning time), 35-45 ms a batch in bench (b) instead of under 2.
_LEASE = f"""
WITH arg AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::text[],
                         $6::int[], $7::int[])
        AS a(job_id, tile_index, token, attempt_id, node, resumed_from, msg_generation)
), cur AS (
    SELECT a.token, a.attempt_id, a.node, a.resumed_from, a.msg_generation, j.job_open, t.*
    FROM arg a
    CROSS JOIN LATERAL (
        SELECT x.ctid AS row_id, x.* FROM tiles x
        WHERE x.job_id = a.job_id AND x.tile_index = a.tile_index OFFSET 0) t
    CROSS JOIN LATERAL (
        SELECT y.state = ANY($10::text[]) AND NOT y.cancel_requested AS job_open
        FROM jobs y WHERE y.job_id = a.job_id OFFSET 0) j
), moved AS (
    UPDATE tiles t SET lease_fence = cur.token,
        state = ($9::text[])[array_position($8::text[], cur.state)],
        samples_done = cur.resumed_from,
        attempt_count = t.attempt_count + 1, updated_at = now(),
        last_error_code = COALESCE($12::text, t.last_error_code),
        last_error = COALESCE($13::text, t.last_error)
    FROM cur
    WHERE t.ctid = ANY (ARRAY (SELECT row_id FROM cur)) AND t.ctid = cur.row_id
      AND t.state = cur.state AND cur.state = ANY($8::text[]) AND t.lease_fence < cur.token
      AND t.attempt_count = $14 AND t.generation <= cur.msg_generation AND cur.job_open
    RETURNING t.job_id, t.tile_index, cur.token, cur.attempt_id, cur.node, cur.resumed_from,
        cur.state AS from_state, t.state AS to_state
), started AS (
    INSERT INTO attempts (attempt_id, job_id, tile_index, kind, node, fence, resumed_from)
    SELECT attempt_id, job_id, tile_index, 'tile', node, token, resumed_from FROM moved
    ON CONFLICT (attempt_id) DO NOTHING
), audited AS (
    INSERT INTO job_events ({EVENT_COLUMNS})
    SELECT job_id, tile_index, attempt_id, node, 'tile', from_state, to_state, $11, $12, $13,
        'fence ' || token FROM moved
)
SELECT EXISTS (SELECT 1 FROM moved m
               WHERE m.job_id = cur.job_id AND m.tile_index = cur.tile_index) AS fenced, cur.*
FROM cur
"""

# The rows are locked in key order, so two batches never wait on each other in a cycle.
_COMMIT = f"""
WITH arg AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::text[], $5::text[],
                         $6::text[], $7::int[], $8::bytea[], $9::text[], $14::float8[])
        AS a(job_id, tile_index, token, attempt_id, result_key, result_sha256, samples_done,
             result_data, node, render_seconds)
), cur AS (
    SELECT a.*, t.state FROM arg a
    JOIN tiles t ON t.job_id = a.job_id AND t.tile_index = a.tile_index
    JOIN jobs j ON j.job_id = t.job_id
    WHERE t.lease_fence = a.token AND t.state = ANY($10::text[]) AND j.state = ANY($12::text[])
    ORDER BY t.job_id, t.tile_index
    FOR UPDATE OF t
), moved AS (
    UPDATE tiles t SET state = ($11::text[])[array_position($10::text[], cur.state)],
        result_key = cur.result_key, result_sha256 = cur.result_sha256,
        samples_done = cur.samples_done,
        last_error_code = NULL, last_error = NULL, updated_at = now()
    FROM cur
    WHERE t.job_id = cur.job_id AND t.tile_index = cur.tile_index
    RETURNING t.job_id, t.tile_index, cur.attempt_id, cur.node, cur.result_sha256,
        cur.result_data, cur.render_seconds, cur.state AS from_state, t.state AS to_state
), ended AS (
    UPDATE attempts a SET ended_at = now(), outcome = 'done', render_seconds = m.render_seconds
    FROM moved m WHERE a.attempt_id = m.attempt_id AND a.ended_at IS NULL
), audited AS (
    INSERT INTO job_events ({EVENT_COLUMNS})
    SELECT job_id, tile_index, attempt_id, node, 'tile', from_state, to_state, $13, NULL, NULL,
        NULL FROM moved
), stored AS (
    INSERT INTO tile_results (job_id, tile_index, sha256, data)
    SELECT job_id, tile_index, result_sha256, result_data FROM moved
    WHERE result_data IS NOT NULL
    ON CONFLICT (job_id, tile_index) DO UPDATE SET sha256 = EXCLUDED.sha256, data = EXCLUDED.data
)
SELECT job_id, tile_index FROM moved
"""


async def fence(conn: Conn, lease: TileFence, generation: int) -> FirstFence:
    """Fence a never-leased tile in one statement, for a message of ``generation`` or newer.

    Fenced only in the plain case (never leased, LEASE legal from its state, the fence below the
    token, the message not older than the row's, the job in a state TILE_STARTED leaves as it
    is and not cancel-requested); else nothing is written. Either way the tile row as it was
    just before comes back (``None``: no such tile), for the caller to decide on.
    """
    return (await fence_many(conn, [(lease, generation)]))[0]


async def fence_many(conn: Conn, calls: Sequence[tuple[TileFence, int]]) -> list[FirstFence]:
    """:func:`fence` of each ``(lease, generation)`` in one statement, answers in call order.

    Each tile is decided on its own row as if it were alone; no two calls may name one tile.
    """
    rows = await _lease_rows(conn, calls, _LEASE_MOVES, attempts=0, job_states=_STARTED_QUIET)
    return [
        FirstFence(False, None) if row is None else FirstFence(row["fenced"], Tile.from_record(row))
        for row in rows
    ]


async def commit(conn: Conn, done: TileCommit) -> bool | None:
    """True if the statement alone committed the tile; None (nothing written): run the
    transaction."""
    return (await commit_many(conn, [done]))[0]


async def commit_many(conn: Conn, dones: Sequence[TileCommit]) -> list[bool | None]:
    """:func:`commit` of each of ``dones`` in one statement, answers in call order (no two may
    name one tile)."""
    committed = await write_commits(conn, dones, _COMMIT_MOVES, _PROGRESS_QUIET)
    return [True if (d.job_id, d.tile_index) in committed else None for d in dones]


async def write_lease(
    conn: Conn,
    lease: TileFence,
    state: TileState,
    *,
    attempts: int,
    job_states: Sequence[JobState],
    error_code: str | None = None,
    error: str | None = None,
) -> bool:
    """LEASE the tile from ``state`` (after ``attempts`` attempts) for ``lease.token``, its job
    in one of ``job_states`` and not cancel-requested; record the attempt and the audit row.

    ``error_code``/``error`` (a takeover's superseded owners) go on the audit row and become
    the tile's last error. False: no row matched, nothing was written.
    """
    move = [(state, transition_tile(state, TileTrigger.LEASE))]
    (row,) = await _lease_rows(
        conn, [(lease, ANY_GENERATION)], move, attempts=attempts, job_states=job_states,
        error_code=error_code, error=error,
    )  # fmt: skip
    return row is not None and bool(row["fenced"])


async def _lease_rows(
    conn: Conn,
    calls: Sequence[tuple[TileFence, int]],
    moves: Sequence[tuple[TileState, TileState]],
    *,
    attempts: int,
    job_states: Sequence[JobState],
    error_code: str | None = None,
    error: str | None = None,
) -> list[Record | None]:
    """The statement's row of each call's tile (``fenced`` and the row as it was before), in
    call order; ``None`` for a tile that does not exist."""
    leases = [lease for lease, _ in calls]
    rows = await conn.fetch(
        _LEASE,
        [lease.job_id for lease in leases],
        [lease.tile_index for lease in leases],
        [lease.token for lease in leases],
        [lease.attempt_id for lease in leases],
        [lease.node for lease in leases],
        [lease.resumed_from for lease in leases],
        [generation for _, generation in calls],
        [a.value for a, _ in moves],
        [b.value for _, b in moves],
        [s.value for s in job_states],
        TileTrigger.LEASE.value,
        error_code,
        error,
        attempts,
    )
    by_tile = {(row["job_id"], row["tile_index"]): row for row in rows}
    return [by_tile.get((lease.job_id, lease.tile_index)) for lease in leases]


async def write_commit(
    conn: Conn,
    done: TileCommit,
    moves: Sequence[tuple[TileState, TileState]],
    job_states: Sequence[JobState],
) -> bool:
    """COMMIT the tile by one of ``moves`` (``(from, to)``) under ``done.token``, its job in one
    of ``job_states``: the result columns, the attempt closed as done, the audit row and an
    inline result. False: no row matched, nothing was written."""
    return bool(await write_commits(conn, [done], moves, job_states))


async def write_commits(
    conn: Conn,
    dones: Sequence[TileCommit],
    moves: Sequence[tuple[TileState, TileState]],
    job_states: Sequence[JobState],
) -> set[tuple[str, int]]:
    """:func:`write_commit` of each of ``dones`` in one statement; ``(job_id, tile_index)`` of
    the tiles it committed."""
    rows = await conn.fetch(
        _COMMIT,
        [d.job_id for d in dones],
        [d.tile_index for d in dones],
        [d.token for d in dones],
        [d.attempt_id for d in dones],
        [d.result_key for d in dones],
        [d.result_sha256 for d in dones],
        [d.samples_done for d in dones],
        [d.result_data for d in dones],
        [d.node for d in dones],
        [a.value for a, _ in moves],
        [b.value for _, b in moves],
        [s.value for s in job_states],
        TileTrigger.COMMIT.value,
        [d.render_seconds for d in dones],
    )
    return {(row["job_id"], row["tile_index"]) for row in rows}
