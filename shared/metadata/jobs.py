"""Job rows: idempotent submit, compare-and-set transitions, cancel, retry, completion.

Every function runs on the caller's connection inside the caller's transaction. A state change
is always ``UPDATE ... WHERE job_id = $1 AND state = $current``, with the new state computed by
:func:`shared.core.lifecycle.transition_job`; when that matches no row a concurrent writer moved
first and :class:`CasMiss` makes the store rerun the whole transaction from a fresh read.
Self-loops (the machine returns the current state) write nothing and are not audited.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shared.core.errors import ConflictError, NotFoundError, ValidationError
from shared.core.lifecycle import (
    TERMINAL_JOB_STATES,
    IllegalTransition,
    JobState,
    JobTrigger,
    transition_job,
)
from shared.metadata import audit
from shared.metadata.audit import Conn, Who
from shared.metadata.models import SUBMIT_TRIGGER, AttemptOutcome, Job, NewJob, SubmitResult

MAX_LIST = 1000


class CasMiss(Exception):
    """A compare-and-set matched no row: a concurrent writer won; rerun the transaction."""


async def insert_job(conn: Conn, new: NewJob, who: Who) -> SubmitResult:
    """Create the job bound to ``new.idempotency_key``, or return the one already bound."""
    row = await conn.fetchrow(
        """
        INSERT INTO jobs (job_id, idempotency_key, fingerprint, project, request, scene, frame,
                          input_hash, width, height, spp, tile_size, state, priority,
                          deadline_at, renderer, tile_auto, cost_key)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                $18)
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING *
        """,
        new.job_id,
        new.idempotency_key,
        new.fingerprint,
        new.project,
        new.request,
        new.scene,
        new.frame,
        new.input_hash,
        new.width,
        new.height,
        new.spp,
        new.tile_size,
        JobState.QUEUED.value,
        new.priority,
        new.deadline_at,
        new.renderer,
        new.tile_auto,
        new.cost_key,
    )
    if row is not None:
        await audit.record_event(
            conn,
            new.job_id,
            tile_index=None,
            from_state=None,
            to_state=JobState.QUEUED,
            trigger=SUBMIT_TRIGGER,
            who=who,
        )
        return SubmitResult(Job.from_record(row), created=True)
    existing = await conn.fetchrow(
        "SELECT * FROM jobs WHERE idempotency_key = $1", new.idempotency_key
    )
    if existing is None:  # the conflicting row vanished between the two statements
        raise CasMiss
    job = Job.from_record(existing)
    if job.fingerprint != new.fingerprint:
        raise ConflictError(
            f"idempotency key {new.idempotency_key!r} is already bound to job {job.job_id} "
            "with a different request body"
        )
    return SubmitResult(job, created=False)


async def fetch_job(conn: Conn, job_id: str) -> Job | None:
    """The job, or ``None``."""
    row = await conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1", job_id)
    return None if row is None else Job.from_record(row)


async def require_job(conn: Conn, job_id: str) -> Job:
    """The job, or :class:`NotFoundError`."""
    job = await fetch_job(conn, job_id)
    if job is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return job


async def state_of(conn: Conn, job_id: str) -> JobState:
    """The job's current state, or :class:`NotFoundError`."""
    value = await conn.fetchval("SELECT state FROM jobs WHERE job_id = $1", job_id)
    if value is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return JobState(value)


_LIST_COLUMNS = ", ".join(
    "'{}'::jsonb AS scene" if f.name == "scene" else f.name for f in dataclasses.fields(Job)
)


async def fetch_job_light(conn: Conn, job_id: str) -> Job | None:
    """The job with an empty ``scene`` (read often, by the console), or ``None``."""
    row = await conn.fetchrow(f"SELECT {_LIST_COLUMNS} FROM jobs WHERE job_id = $1", job_id)
    return None if row is None else Job.from_record(row)


async def list_jobs(
    conn: Conn, *, state: JobState | None, limit: int, before: str | None
) -> list[Job]:
    """Newest first; ``before`` is the last ``job_id`` of the previous page (keyset paging).

    Listed jobs carry an empty ``scene``: a page of 1000 jobs must not drag up to 4 MiB of
    scene document each out of the database.
    """
    if not 1 <= limit <= MAX_LIST:
        raise ValidationError(f"limit: {limit} must be between 1 and {MAX_LIST}")
    where: list[str] = []
    args: list[Any] = []
    if state is not None:
        args.append(JobState(state).value)
        where.append(f"state = ${len(args)}")
    if before is not None:
        args.append(before)
        where.append(f"job_id < ${len(args)}")
    args.append(limit)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    query = f"SELECT {_LIST_COLUMNS} FROM jobs {clause} ORDER BY job_id DESC LIMIT ${len(args)}"
    return [Job.from_record(row) for row in await conn.fetch(query, *args)]


async def stale_queued(conn: Conn, *, older_than: float, limit: int) -> list[Job]:
    """Queued, unplanned, not cancel-requested jobs not updated for ``older_than`` seconds."""
    rows = await conn.fetch(
        f"""
        SELECT {_LIST_COLUMNS} FROM jobs
        WHERE state = $1 AND tiles_total = 0 AND NOT cancel_requested
          AND updated_at < now() - make_interval(secs => $2)
        ORDER BY job_id LIMIT $3
        """,
        JobState.QUEUED.value,
        older_than,
        limit,
    )
    return [Job.from_record(row) for row in rows]


def next_state(job_id: str, current: JobState, trigger: JobTrigger) -> JobState:
    """:func:`transition_job`, with the job named in the error."""
    try:
        return transition_job(current, trigger)
    except IllegalTransition:
        raise IllegalTransition(
            f"job {job_id}: {JobTrigger(trigger).value} is illegal in state {current.value}"
        ) from None


async def move_job(
    conn: Conn,
    job_id: str,
    trigger: JobTrigger,
    *,
    expected: JobState | None = None,
    who: Who,
) -> JobState:
    """Apply ``trigger``; with ``expected``, a job in any other state is IllegalTransition."""
    if expected is None:
        return await cas_job(conn, job_id, await state_of(conn, job_id), trigger, who)
    try:
        return await cas_job(conn, job_id, JobState(expected), trigger, who)
    except CasMiss:
        actual = await state_of(conn, job_id)
        raise IllegalTransition(
            f"job {job_id}: {JobTrigger(trigger).value} expected state {expected.value}, "
            f"but the job is {actual.value}"
        ) from None


async def cas_job(
    conn: Conn, job_id: str, current: JobState, trigger: JobTrigger, who: Who
) -> JobState:
    """Move the job from ``current`` by ``trigger``; :class:`CasMiss` if it is not there."""
    target = next_state(job_id, current, trigger)
    if target == current:
        await _confirm_self_loop(conn, job_id, current, who)
        return target
    moved = await conn.fetchval(
        """
        UPDATE jobs SET state = $3, updated_at = now(),
            finished_at = CASE WHEN $4 THEN now() END,
            last_error_code = COALESCE($5, last_error_code),
            last_error = COALESCE($6, last_error)
        WHERE job_id = $1 AND state = $2
        RETURNING true
        """,
        job_id,
        current.value,
        target.value,
        target in TERMINAL_JOB_STATES,
        who.error_code,
        who.error,
    )
    if moved is None:
        raise CasMiss
    await audit.record_event(
        conn,
        job_id,
        tile_index=None,
        from_state=current,
        to_state=target,
        trigger=trigger,
        who=who,
    )
    return target


async def try_move_job(conn: Conn, job_id: str, trigger: JobTrigger, who: Who) -> bool:
    """Best effort: apply ``trigger`` if the job's state allows it; False if illegal."""
    try:
        await cas_job(conn, job_id, await state_of(conn, job_id), trigger, who)
    except IllegalTransition:
        return False
    return True


async def _confirm_self_loop(conn: Conn, job_id: str, current: JobState, who: Who) -> None:
    """A self-loop writes no state, but is still a compare-and-set on ``current``."""
    if who.error_code is None and who.error is None:
        query = "SELECT true FROM jobs WHERE job_id = $1 AND state = $2"
        still = await conn.fetchval(query, job_id, current.value)
    else:
        still = await conn.fetchval(
            """
            UPDATE jobs SET last_error_code = COALESCE($3, last_error_code),
                last_error = COALESCE($4, last_error), updated_at = now()
            WHERE job_id = $1 AND state = $2
            RETURNING true
            """,
            job_id,
            current.value,
            who.error_code,
            who.error,
        )
    if still is None:
        raise CasMiss


async def request_cancel(conn: Conn, job_id: str, who: Who) -> None:
    """Flag the job and move it by CANCEL (its idle tiles are cancelled by the caller)."""
    await move_job(conn, job_id, JobTrigger.CANCEL, who=who)
    await conn.execute(
        "UPDATE jobs SET cancel_requested = true, updated_at = now() WHERE job_id = $1", job_id
    )


async def is_cancel_requested(conn: Conn, job_id: str) -> bool:
    """The job's cancel flag, or :class:`NotFoundError`."""
    value = await conn.fetchval("SELECT cancel_requested FROM jobs WHERE job_id = $1", job_id)
    if value is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return bool(value)


async def retry(conn: Conn, job_id: str, who: Who) -> None:
    """RETRY the job: a new generation, errors cleared, a deadline that has passed dropped
    (a retry of a ``deadline_exceeded`` job would fail again at once); tiles are the caller's
    next step."""
    await move_job(conn, job_id, JobTrigger.RETRY, who=who)
    await conn.execute(
        """
        UPDATE jobs SET generation = generation + 1, last_error_code = NULL, last_error = NULL,
            deadline_at = CASE WHEN deadline_at <= now() THEN NULL ELSE deadline_at END
        WHERE job_id = $1
        """,
        job_id,
    )


async def complete(
    conn: Conn,
    job_id: str,
    *,
    result_location: str,
    result_sha256: str,
    float_location: str,
    who: Who,
) -> None:
    """FINALIZED plus the result columns; idempotent for the same sha, else ConflictError."""
    row = await conn.fetchrow("SELECT state, result_sha256 FROM jobs WHERE job_id = $1", job_id)
    if row is None:
        raise NotFoundError(f"job {job_id} does not exist")
    if row["state"] == JobState.COMPLETED:
        if row["result_sha256"] != result_sha256:
            raise ConflictError(
                f"job {job_id} is already completed with sha256 {row['result_sha256']}, "
                f"not {result_sha256}"
            )
        return
    await cas_job(conn, job_id, JobState(row["state"]), JobTrigger.FINALIZED, who)
    await conn.execute(
        """
        UPDATE jobs SET result_location = $2, result_sha256 = $3, float_location = $4
        WHERE job_id = $1
        """,
        job_id,
        result_location,
        result_sha256,
        float_location,
    )
    await audit.end_attempt(conn, who.attempt_id, AttemptOutcome.DONE)
