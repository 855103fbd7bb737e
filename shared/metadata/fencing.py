"""The owner's writes on a tile, all fenced by the lease's token.

Every write is a compare-and-set on the state just read and on ``lease_fence``: the lease's
acquire revision is written with ``lease_fence < $token`` (a newer owner always holds a larger
token), and progress, commit and failure require ``lease_fence = $token``. A miss raises
:class:`CasMiss` and the store reruns the transaction, so the decision is made again from
fresh rows. The job row is written before the tile row (see :mod:`shared.metadata.tiles`).

The fence and the commit decide here and write through the statements of
:mod:`shared.metadata.fastpath`, which also run alone for the common case: this module owns
the refusals, the job's moves and a takeover's superseded attempts, the statement the rows.

Tile audit rows: every state change, and every LEASE (a re-lease of a ``leased`` tile is a new
owner taking over, which the trail must show); repeated PROGRESS updates are not audited.
"""

from __future__ import annotations

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
from shared.metadata import audit, fastpath, jobs
from shared.metadata.audit import Conn, Who
from shared.metadata.jobs import CasMiss
from shared.metadata.models import AttemptOutcome, CommitOutcome, Tile, TileCommit, TileFence
from shared.metadata.tiles import require_tile, require_tile_and_job


async def fence(conn: Conn, lease: TileFence) -> bool:
    """LEASE the tile for ``lease.token`` if it is larger than the current fence (see the store).

    The cases the statement alone does not take are decided here: refusals, the job's
    TILE_STARTED move and a takeover's superseded attempts; the write is the statement's.
    """
    tile, job_state, cancel_requested = await require_tile_and_job(
        conn, lease.job_id, lease.tile_index
    )
    if cancel_requested or is_terminal(job_state) or tile.lease_fence >= lease.token:
        return False
    try:
        transition_tile(tile.state, TileTrigger.LEASE)
        job_target = transition_job(job_state, JobTrigger.TILE_STARTED)
    except IllegalTransition:
        return False
    if job_target != job_state:  # a self-loop writes nothing: the state was just read here
        who = Who(lease.node, lease.attempt_id)
        await jobs.cas_job(conn, lease.job_id, job_state, JobTrigger.TILE_STARTED, who)
    error_code, error = _NO_ERROR
    if tile.attempt_count:  # only a tile leased before can have open attempts to supersede
        error_code, error = await _superseded(conn, tile, lease.token)
    moved = await fastpath.write_lease(
        conn,
        lease,
        tile.state,
        attempts=tile.attempt_count,
        job_states=[job_target],
        error_code=error_code,
        error=error,
    )
    if not moved:
        raise CasMiss
    return True


_NO_ERROR: tuple[str | None, str | None] = (None, None)


async def _superseded(conn: Conn, tile: Tile, token: int) -> tuple[str | None, str | None]:
    """The error a takeover records (audit row, tile's last error): the open attempts it
    supersedes, or no error if there are none."""
    abandoned = await audit.open_attempts(conn, tile.job_id, tile.tile_index, below=token)
    if not abandoned:
        return _NO_ERROR
    names = ", ".join(f"{a} on {node}" for a, node in abandoned)
    return audit.ABANDONED, f"took over from attempt {names}: its lease expired without a renew"


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


async def commit(conn: Conn, done: TileCommit) -> CommitOutcome:
    """The fenced commit: COMMIT the tile, close the attempt, TILE_PROGRESS the job.

    The cases the statement alone does not take are decided here: a refused commit (only the
    attempt's ``fenced`` outcome is written) and the job's TILE_PROGRESS move; the write is the
    statement's.
    """
    tile, job_state, _ = await require_tile_and_job(conn, done.job_id, done.tile_index)
    if tile.state == TileState.DONE or tile.lease_fence != done.token:
        await audit.end_attempt(conn, done.attempt_id, AttemptOutcome.FENCED)
        already = tile.state == TileState.DONE
        return CommitOutcome.ALREADY_DONE if already else CommitOutcome.FENCED
    try:
        target = transition_tile(tile.state, TileTrigger.COMMIT)
    except IllegalTransition:  # the fence is ours but the lease was lost or handed back
        await audit.end_attempt(conn, done.attempt_id, AttemptOutcome.FENCED)
        return CommitOutcome.FENCED
    job_after = await _progress_job(conn, done.job_id, job_state, Who(done.node, done.attempt_id))
    if not await fastpath.write_commit(conn, done, [(tile.state, target)], [job_after]):
        raise CasMiss
    return CommitOutcome.COMMITTED


async def _progress_job(conn: Conn, job_id: str, state: JobState, who: Who) -> JobState:
    """TILE_PROGRESS the job if its state (read in this transaction) moves by it at all; the
    job's state afterwards."""
    try:
        target = transition_job(state, JobTrigger.TILE_PROGRESS)
    except IllegalTransition:
        return state  # e.g. the job is already terminal: the tile's commit still stands
    if target != state:
        await jobs.cas_job(conn, job_id, state, JobTrigger.TILE_PROGRESS, who)
    return target


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
