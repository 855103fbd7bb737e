"""One-statement versions of the owner's two hot writes: the lease fence and the fenced commit.

:mod:`shared.metadata.fencing` is the authority: a read, decisions in Python through
:mod:`shared.lifecycle`, then compare-and-set writes, in one transaction (BEGIN, read, writes,
COMMIT: five round trips or more). For the case every tile of a running job goes through, the
functions here make the *same* writes in one statement of data-modifying CTEs (one round trip,
atomic on its own): the tile row's compare-and-set, the attempt row and the audit row.

They only ever take the common case, and decline (``None``) everything else, so the caller runs
the transaction instead, which decides from fresh rows as it always did:

- the fence: the tile as the caller just read it (state, fence below the token, never leased
  before: no takeover to explain), its job in a state where TILE_STARTED writes nothing and not
  cancel-requested. The tile's compare-and-set is on the state that was read, so a tile that
  moved since matches no row;
- the commit: the tile leased under this token and in a state COMMIT leaves, its job in a state
  where TILE_PROGRESS writes nothing.

The target states come from the lifecycle tables (passed as parameters), never from SQL;
``tests/metadata/test_fastpath.py`` checks row for row that both paths write the same.
"""

from __future__ import annotations

from shared.lifecycle import (
    IllegalTransition,
    JobState,
    JobTrigger,
    TileState,
    TileTrigger,
    is_terminal,
    transition_job,
    transition_tile,
)
from shared.metadata.audit import EVENT_COLUMNS, Conn, Who
from shared.metadata.models import Tile


def quiet_job_states(trigger: JobTrigger) -> list[str]:
    """Live job states that ``trigger`` leaves unchanged (the transaction writes no job row)."""
    quiet = []
    for state in JobState:
        try:
            if not is_terminal(state) and transition_job(state, trigger) == state:
                quiet.append(state.value)
        except IllegalTransition:
            continue
    return quiet


def _moves(trigger: TileTrigger) -> tuple[list[str], list[str]]:
    """Tile states ``trigger`` is legal in, and their targets (parallel lists)."""
    froms, tos = [], []
    for state in TileState:
        try:
            target = transition_tile(state, trigger)
        except IllegalTransition:
            continue
        froms.append(state.value)
        tos.append(target.value)
    return froms, tos


_STARTED_QUIET = quiet_job_states(JobTrigger.TILE_STARTED)
_PROGRESS_QUIET = quiet_job_states(JobTrigger.TILE_PROGRESS)
_COMMIT_FROM, _COMMIT_TO = _moves(TileTrigger.COMMIT)

_FENCE = f"""
WITH moved AS (
    UPDATE tiles t SET lease_fence = $3, state = $6, samples_done = $7,
        attempt_count = t.attempt_count + 1, updated_at = now()
    FROM jobs j
    WHERE t.job_id = $1 AND t.tile_index = $2 AND t.state = $5 AND t.lease_fence < $3
      AND t.attempt_count = 0
      AND j.job_id = t.job_id AND j.state = ANY($8::text[]) AND NOT j.cancel_requested
    RETURNING t.tile_index
), started AS (
    INSERT INTO attempts (attempt_id, job_id, tile_index, kind, node, fence, resumed_from)
    SELECT $4, $1, $2, 'tile', $9, $3, $7 FROM moved
    ON CONFLICT (attempt_id) DO NOTHING
), audited AS (
    INSERT INTO job_events ({EVENT_COLUMNS})
    SELECT $1, $2, $4, $9, 'tile', $5, $6, $10, NULL, NULL, $11 FROM moved
)
SELECT count(*) FROM moved
"""

_COMMIT = f"""
WITH cur AS (
    SELECT t.state FROM tiles t JOIN jobs j ON j.job_id = t.job_id
    WHERE t.job_id = $1 AND t.tile_index = $2 AND t.lease_fence = $3
      AND t.state = ANY($9::text[]) AND j.state = ANY($11::text[])
    FOR UPDATE OF t
), moved AS (
    UPDATE tiles t SET state = ($10::text[])[array_position($9::text[], cur.state)],
        result_key = $5, result_sha256 = $6, samples_done = $7,
        last_error_code = NULL, last_error = NULL, updated_at = now()
    FROM cur
    WHERE t.job_id = $1 AND t.tile_index = $2
    RETURNING cur.state AS from_state, t.state AS to_state
), ended AS (
    UPDATE attempts SET ended_at = now(), outcome = 'done'
    WHERE attempt_id = $4 AND ended_at IS NULL AND EXISTS (SELECT 1 FROM moved)
), audited AS (
    INSERT INTO job_events ({EVENT_COLUMNS})
    SELECT $1, $2, $4, $12, 'tile', from_state, to_state, $13, NULL, NULL, NULL FROM moved
), stored AS (
    INSERT INTO tile_results (job_id, tile_index, sha256, data)
    SELECT $1, $2, $6, $8::bytea FROM moved WHERE $8::bytea IS NOT NULL
    ON CONFLICT (job_id, tile_index) DO UPDATE SET sha256 = EXCLUDED.sha256, data = EXCLUDED.data
)
SELECT count(*) FROM moved
"""


async def fence(
    conn: Conn,
    seen: Tile,
    *,
    token: int,
    who: Who,
    resumed_from: int,
) -> bool | None:
    """True if the tile was fenced for ``token`` in one statement; None: run the transaction.

    ``seen`` is the tile as the caller read it; ``who.detail`` is the audit detail.
    """
    if seen.attempt_count or seen.lease_fence >= token:
        return None
    try:
        target = transition_tile(seen.state, TileTrigger.LEASE)
    except IllegalTransition:
        return None
    moved = await conn.fetchval(
        _FENCE,
        seen.job_id,
        seen.tile_index,
        token,
        who.attempt_id,
        seen.state.value,
        target.value,
        resumed_from,
        _STARTED_QUIET,
        who.node,
        TileTrigger.LEASE.value,
        who.detail,
    )
    return True if moved else None


async def commit(
    conn: Conn,
    job_id: str,
    tile_index: int,
    *,
    token: int,
    result_key: str | None,
    result_sha256: str,
    result_data: bytes | None,
    samples_done: int,
    who: Who,
) -> bool | None:
    """True if the tile was committed in one statement; None: run the transaction."""
    moved = await conn.fetchval(
        _COMMIT,
        job_id,
        tile_index,
        token,
        who.attempt_id,
        result_key,
        result_sha256,
        samples_done,
        result_data,
        _COMMIT_FROM,
        _COMMIT_TO,
        _PROGRESS_QUIET,
        who.node,
        TileTrigger.COMMIT.value,
    )
    return True if moved else None
