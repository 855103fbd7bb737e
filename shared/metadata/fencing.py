"""The owner's writes on a tile, all fenced by the lease's token.

Every write is a compare-and-set on the state just read and on ``lease_fence``: the lease's
acquire revision is written with ``lease_fence < $token`` (a newer owner always holds a larger
token), and progress, commit and failure require ``lease_fence = $token``. A miss raises
:class:`CasMiss` and the store reruns the transaction, so the decision is made again from
fresh rows. The job row is written before the tile row (see :mod:`shared.metadata.tiles`).

Tile audit rows: every state change, and every LEASE (a re-lease of a ``leased`` tile is a new
owner taking over, which the trail must show); repeated PROGRESS updates are not audited.
"""

from __future__ import annotations

import dataclasses

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
from shared.metadata import audit, jobs
from shared.metadata.audit import Conn, Who
from shared.metadata.jobs import CasMiss
from shared.metadata.models import AttemptOutcome, CommitOutcome, Tile
from shared.metadata.tiles import require_tile, require_tile_and_job


async def fence(
    conn: Conn,
    job_id: str,
    tile_index: int,
    *,
    token: int,
    attempt_id: str,
    who: Who,
    resumed_from: int,
) -> bool:
    """LEASE the tile for ``token`` if it is larger than the current fence (see the store)."""
    tile, job_state, cancel_requested = await require_tile_and_job(conn, job_id, tile_index)
    if cancel_requested or is_terminal(job_state) or tile.lease_fence >= token:
        return False
    try:
        target = transition_tile(tile.state, TileTrigger.LEASE)
        job_target = transition_job(job_state, JobTrigger.TILE_STARTED)
    except IllegalTransition:
        return False
    if job_target != job_state:  # a self-loop writes nothing: the state was just read here
        await jobs.cas_job(conn, job_id, job_state, JobTrigger.TILE_STARTED, who)
    moved = await conn.fetchval(
        """
        UPDATE tiles SET lease_fence = $3, state = $5, samples_done = $6,
            attempt_count = attempt_count + 1, updated_at = now()
        WHERE job_id = $1 AND tile_index = $2 AND lease_fence < $3 AND state = $4
        RETURNING true
        """,
        job_id,
        tile_index,
        token,
        tile.state.value,
        target.value,
        resumed_from,
    )
    if moved is None:
        raise CasMiss
    lease_who = _with_detail(Who(who.node, attempt_id), f"fence {token}")
    if tile.attempt_count:  # only a tile leased before can have open attempts to supersede
        lease_who = await _supersede(conn, tile, token, lease_who)
    await audit.start_tile_attempt(
        conn,
        tile,
        to_state=target.value,
        trigger=TileTrigger.LEASE.value,
        fence=token,
        resumed_from=resumed_from,
        who=lease_who,
    )
    return True


async def _supersede(conn: Conn, tile: Tile, token: int, who: Who) -> Who:
    """Name the open attempts a takeover supersedes, in the trail and the tile's last error."""
    abandoned = await audit.open_attempts(conn, tile.job_id, tile.tile_index, below=token)
    if not abandoned:
        return who
    names = ", ".join(f"{a} on {node}" for a, node in abandoned)
    why = f"took over from attempt {names}: its lease expired without a renew"
    await conn.execute(
        "UPDATE tiles SET last_error_code = $3, last_error = $4"
        " WHERE job_id = $1 AND tile_index = $2",
        tile.job_id,
        tile.tile_index,
        audit.ABANDONED,
        why,
    )
    return dataclasses.replace(who, error_code=audit.ABANDONED, error=why)


async def progress(
    conn: Conn, job_id: str, tile_index: int, *, token: int, samples_done: int, who: Who
) -> bool:
    """Record ``samples_done`` under the fence (PROGRESS); False if the fence is lost."""
    tile = await require_tile(conn, job_id, tile_index)
    if tile.lease_fence != token:
        return False
    try:
        target = transition_tile(tile.state, TileTrigger.PROGRESS)
    except IllegalTransition:
        return False
    moved = await conn.fetchval(
        """
        UPDATE tiles SET samples_done = $5, state = $6, updated_at = now()
        WHERE job_id = $1 AND tile_index = $2 AND lease_fence = $3 AND state = $4
        RETURNING true
        """,
        job_id,
        tile_index,
        token,
        tile.state.value,
        samples_done,
        target.value,
    )
    if moved is None:
        raise CasMiss
    if target != tile.state:
        await _audit(conn, tile, target, TileTrigger.PROGRESS, who)
    return True


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
) -> CommitOutcome:
    """The fenced commit: COMMIT the tile, close the attempt, TILE_PROGRESS the job.

    ``result_data`` (a small result, ``result_key`` None) is stored in ``tile_results``.
    """
    tile, job_state, _ = await require_tile_and_job(conn, job_id, tile_index)
    if tile.state == TileState.DONE or tile.lease_fence != token:
        await audit.end_attempt(conn, who.attempt_id, AttemptOutcome.FENCED)
        done = tile.state == TileState.DONE
        return CommitOutcome.ALREADY_DONE if done else CommitOutcome.FENCED
    try:
        target = transition_tile(tile.state, TileTrigger.COMMIT)
    except IllegalTransition:  # the fence is ours but the lease was lost or handed back
        await audit.end_attempt(conn, who.attempt_id, AttemptOutcome.FENCED)
        return CommitOutcome.FENCED
    await _progress_job(conn, job_id, job_state, Who(who.node, who.attempt_id))
    moved = await conn.fetchval(
        """
        UPDATE tiles SET state = $5, result_key = $6, result_sha256 = $7, samples_done = $8,
            last_error_code = NULL, last_error = NULL, updated_at = now()
        WHERE job_id = $1 AND tile_index = $2 AND lease_fence = $3 AND state = $4
        RETURNING true
        """,
        job_id,
        tile_index,
        token,
        tile.state.value,
        target.value,
        result_key,
        result_sha256,
        samples_done,
    )
    if moved is None:
        raise CasMiss
    if result_data is not None:
        await store_result(conn, job_id, tile_index, result_sha256, result_data)
    await audit.end_tile_attempt(
        conn,
        tile,
        to_state=target.value,
        trigger=TileTrigger.COMMIT.value,
        outcome=AttemptOutcome.DONE,
        who=who,
    )
    return CommitOutcome.COMMITTED


async def store_result(conn: Conn, job_id: str, tile_index: int, sha256: str, data: bytes) -> None:
    """Write a small tile result inline (``tile_results``), in the commit's transaction."""
    await conn.execute(
        """
        INSERT INTO tile_results (job_id, tile_index, sha256, data) VALUES ($1, $2, $3, $4)
        ON CONFLICT (job_id, tile_index) DO UPDATE SET sha256 = EXCLUDED.sha256,
            data = EXCLUDED.data
        """,
        job_id,
        tile_index,
        sha256,
        data,
    )


async def _progress_job(conn: Conn, job_id: str, state: JobState, who: Who) -> None:
    """TILE_PROGRESS the job if its state (read in this transaction) moves by it at all."""
    try:
        target = transition_job(state, JobTrigger.TILE_PROGRESS)
    except IllegalTransition:
        return  # e.g. the job is already terminal: the tile's commit still stands
    if target != state:
        await jobs.cas_job(conn, job_id, state, JobTrigger.TILE_PROGRESS, who)


async def fail(
    conn: Conn,
    job_id: str,
    tile_index: int,
    *,
    token: int | None,
    trigger: TileTrigger,
    outcome: AttemptOutcome | None,
    job_trigger: JobTrigger | None,
    who: Who,
) -> Tile | None:
    """Move the tile by a failure ``trigger``; fenced when ``token`` is given (None if not ours)."""
    tile = await require_tile(conn, job_id, tile_index)
    if token is not None and tile.lease_fence != token:
        await audit.end_attempt(conn, who.attempt_id, AttemptOutcome.FENCED)
        return None
    target = _next(tile, trigger)
    if job_trigger is not None:
        await jobs.try_move_job(conn, job_id, job_trigger, who)
    row = await conn.fetchrow(
        """
        UPDATE tiles SET state = $5, last_error_code = $6, last_error = $7, updated_at = now()
        WHERE job_id = $1 AND tile_index = $2 AND ($3::bigint IS NULL OR lease_fence = $3)
          AND state = $4
        RETURNING *
        """,
        job_id,
        tile_index,
        token,
        tile.state.value,
        target.value,
        who.error_code,
        who.error,
    )
    if row is None:
        raise CasMiss
    if outcome is not None:
        await audit.end_attempt(
            conn, who.attempt_id, outcome, error_code=who.error_code, error=who.error
        )
    await _audit(conn, tile, target, trigger, who)
    return Tile.from_record(row)


def _next(tile: Tile, trigger: TileTrigger) -> TileState:
    try:
        return transition_tile(tile.state, trigger)
    except IllegalTransition:
        raise IllegalTransition(
            f"tile {tile.tile_index} of job {tile.job_id}: {TileTrigger(trigger).value} is "
            f"illegal in state {tile.state.value}"
        ) from None


def _with_detail(who: Who, detail: str) -> Who:
    return Who(who.node, who.attempt_id, who.error_code, who.error, who.detail or detail)


async def _audit(conn: Conn, tile: Tile, target: TileState, trigger: TileTrigger, who: Who) -> None:
    await audit.record_event(
        conn,
        tile.job_id,
        tile_index=tile.tile_index,
        from_state=tile.state,
        to_state=target,
        trigger=trigger,
        who=who,
    )
