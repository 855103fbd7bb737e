"""``MetadataStore``: the typed, async API of the metadata store (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import asyncpg
from asyncpg import Record

from shared.core.errors import NotFoundError
from shared.core.lifecycle import JobState, JobTrigger, TileState, TileTrigger, tile_legal_events
from shared.metadata import (
    audit,
    control,
    costs,
    dispatch,
    fastpath,
    fencing,
    jobs,
    projects,
    tiles,
)
from shared.metadata.audit import Conn, Who
from shared.metadata.base import StoreBase
from shared.metadata.coalesce import Coalescer
from shared.metadata.console import ConsoleStore
from shared.metadata.models import (
    Attempt,
    AttemptOutcome,
    AuditEvent,
    CommitOutcome,
    FirstFence,
    Job,
    JobControl,
    NewJob,
    Project,
    ProjectView,
    SubmitResult,
    Tile,
    TileCommit,
    TileCounts,
    TileFence,
    TileResultRef,
)
from shared.metadata.ops import OpsStore

_WORKING = (TileState.LEASED, TileState.PROGRESSING)
#: calls one group-commit statement carries at most (:class:`Coalescer`)
GROUP_LIMIT = 64
#: tiles an operator retry sends back to the queue (derived from the tile machine)
REQUEUE_ON_RETRY = tiles.REQUEUE_ON_RETRY
#: tiles a cancel stops at once; ``leased``/``progressing`` ones are stopped by their owners
CANCEL_IF_IDLE = tuple(
    s for s in TileState if s not in _WORKING and TileTrigger.CANCEL in tile_legal_events(s)
)


class MetadataStore(StoreBase):
    """Jobs, tiles, attempts and the audit trail in PostgreSQL.

    Every method runs in one transaction, translates asyncpg errors into
    :class:`~shared.core.errors.StoreUnavailable` (retryable) or a terminal error, and moves states
    only through :mod:`shared.core.lifecycle`: an illegal move raises
    :class:`~shared.core.lifecycle.IllegalTransition` and changes nothing. The operator queries and
    the one-tile requeue are :attr:`ops` (an :class:`~shared.metadata.ops.OpsStore` on the
    same pool), the web console's reads :attr:`console` (a
    :class:`~shared.metadata.console.ConsoleStore`).
    """

    def __init__(self, pool: asyncpg.Pool[Record], *, acquire_timeout: float) -> None:
        super().__init__(pool, acquire_timeout=acquire_timeout)
        self.ops = OpsStore(self)
        self.console = ConsoleStore(self)
        # Group commit of the owner's hot path (one statement for the calls of a worker's
        # tiles that arrive together: docs/architecture.md, "Worker flow").
        self._fences = Coalescer(self._fence_batch, limit=GROUP_LIMIT, key=_tile_key)
        self._commits = Coalescer(self._commit_batch, limit=GROUP_LIMIT, key=_commit_key)
        self._completions = Coalescer(self._completed_by_batch, limit=GROUP_LIMIT)

    # ---- jobs -----------------------------------------------------------------------------

    async def submit_job(self, new: NewJob) -> SubmitResult:
        """Create the job for ``new.idempotency_key`` or return the existing one.

        ``created`` is False for a repeat; a repeat with another fingerprint raises
        :class:`~shared.core.errors.ConflictError` naming the key.
        """
        return await self._tx("submit_job", lambda c: jobs.insert_job(c, new, Who()))

    async def get_job(self, job_id: str) -> Job | None:
        """The job, or ``None``."""
        return await self._read("get_job", lambda c: jobs.fetch_job(c, job_id))

    async def list_jobs(
        self, *, state: JobState | None = None, limit: int = 50, before: str | None = None
    ) -> list[Job]:
        """Newest first; pass the last ``job_id`` of a page as ``before`` for the next one."""
        return await self._read(
            "list_jobs", lambda c: jobs.list_jobs(c, state=state, limit=limit, before=before)
        )

    async def transition_job(
        self,
        job_id: str,
        trigger: JobTrigger,
        *,
        expected: JobState | None = None,
        node: str = "",
        attempt_id: str | None = None,
        error_code: str | None = None,
        error: str | None = None,
        detail: str | None = None,
    ) -> Job:
        """Apply ``trigger`` as a compare-and-set and audit it; the job afterwards.

        Without ``expected`` the current state is read and a lost race is retried; with it, a
        job in another state raises IllegalTransition naming the actual state. A self-loop
        writes nothing (except ``last_error*`` when an error is given) and is not audited.
        """
        who = Who(node, attempt_id, error_code, error, detail)

        async def run(conn: Conn) -> Job:
            await jobs.move_job(conn, job_id, trigger, expected=expected, who=who)
            return await jobs.require_job(conn, job_id)

        return await self._tx("transition_job", run)

    async def request_cancel(self, job_id: str, *, node: str = "") -> Job:
        """Set ``cancel_requested``, CANCEL the job and its idle (queued/failed) tiles."""
        who = Who(node)

        async def run(conn: Conn) -> Job:
            await jobs.request_cancel(conn, job_id, who)
            await tiles.move_idle(conn, job_id, CANCEL_IF_IDLE, TileTrigger.CANCEL, who)
            return await jobs.require_job(conn, job_id)

        return await self._tx("request_cancel", run)

    async def is_cancel_requested(self, job_id: str) -> bool:
        """The job's cancel flag (one indexed read, for workers between passes)."""
        return await self._read(
            "is_cancel_requested", lambda c: jobs.is_cancel_requested(c, job_id)
        )

    async def retry_job(self, job_id: str, *, node: str = "") -> Job:
        """RETRY: new generation, errors cleared, failed/dead-lettered tiles REQUEUEd; every
        queued tile of the job unreleased, for the dispatcher to release again (its old
        message, if any, is superseded by the new generation)."""
        who = Who(node)

        async def run(conn: Conn) -> Job:
            await jobs.retry(conn, job_id, who)
            await tiles.move_idle(
                conn, job_id, REQUEUE_ON_RETRY, TileTrigger.REQUEUE, who, fresh=True
            )
            await tiles.unrelease_queued(conn, job_id)
            return await jobs.require_job(conn, job_id)

        return await self._tx("retry_job", run)

    async def complete_job(
        self,
        job_id: str,
        *,
        result_location: str,
        result_sha256: str,
        float_location: str,
        node: str = "",
        attempt_id: str | None = None,
    ) -> Job:
        """FINALIZED with the result columns, in one transaction.

        Already completed with the same sha256: returned unchanged. With another sha256:
        :class:`~shared.core.errors.ConflictError`.
        """
        who = Who(node, attempt_id)

        async def run(conn: Conn) -> Job:
            await jobs.complete(
                conn,
                job_id,
                result_location=result_location,
                result_sha256=result_sha256,
                float_location=float_location,
                who=who,
            )
            return await jobs.require_job(conn, job_id)

        return await self._tx("complete_job", run)

    # ---- job control ----------------------------------------------------------------------

    async def pause_job(self, job_id: str, *, node: str = "") -> tuple[Job, list[int]]:
        """PAUSE the job and un-release its idle tiles in one transaction: the job and the
        tiles handed back. In-flight tiles are stopped by their owners at a pass boundary.

        A paused job pauses again as a no-op; IllegalTransition for a job that does not pause
        (finalizing or final)."""
        who = Who(node)

        async def run(conn: Conn) -> tuple[Job, list[int]]:
            moved = await control.pause(conn, job_id, who)
            return await jobs.require_job(conn, job_id), moved

        return await self._tx("pause_job", run)

    async def resume_job(self, job_id: str, *, node: str = "") -> Job:
        """RESUME: paused -> running, audited (IllegalTransition if the job is not paused)."""
        who = Who(node)

        async def run(conn: Conn) -> Job:
            await control.resume(conn, job_id, who)
            return await jobs.require_job(conn, job_id)

        return await self._tx("resume_job", run)

    async def set_priority(self, job_id: str, priority: int, *, node: str = "") -> Job:
        """Change the priority of a queued, running, progressing or paused job (audited)."""
        return await self._tx(
            "set_priority", lambda c: control.set_priority(c, job_id, priority, Who(node))
        )

    async def unrelease_tile(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int | None,
        attempt_id: str | None = None,
        node: str = "",
    ) -> bool:
        """Hand a tile of a paused job back unreleased (TileTrigger.PAUSE, ``published_at``
        NULL); fenced by ``token`` when its owner does it (its attempt ends ``paused``).
        False, nothing written, if the job is not paused any more or the fence is not ours."""
        who = Who(node, attempt_id)
        return await self._tx(
            "unrelease_tile",
            lambda c: control.unrelease_tile(c, job_id, tile_index, token=token, who=who),
        )

    async def job_control(self, job_id: str) -> JobControl:
        """The job's state, cancel flag and deadline (one indexed read, for workers between
        passes: cancelled, paused or ended?)."""
        return await self._read("job_control", lambda c: control.control_of(c, job_id))

    async def set_project(
        self, name: str, *, weight: float, max_in_flight: int | None, actor: str = ""
    ) -> Project:
        """Upsert the project's weight and cap; a ``project_events`` row names ``actor``."""
        projects.check_settings(weight, max_in_flight)  # before taking a connection
        return await self._tx(
            "set_project",
            lambda c: projects.upsert(
                c, name, weight=weight, max_in_flight=max_in_flight, actor=actor
            ),
        )

    async def projects(
        self, *, window: float, name: str | None = None, limit: int = 1000
    ) -> list[ProjectView]:
        """Projects by name, at most ``limit`` (settings, queued/in-flight tiles, core-second
        share over ``window`` seconds), or only ``name`` (NotFoundError if unknown)."""
        return await self._read(
            "projects",
            lambda c: projects.project_views(c, window=window, name=name, limit=limit),
        )

    async def overdue_jobs(self, *, limit: int = 100) -> list[str]:
        """Live jobs whose deadline has passed, earliest deadline first (index jobs_deadline)."""
        return await self._read("overdue_jobs", lambda c: control.overdue(c, limit=limit))

    async def next_deadline(self) -> float | None:
        """Seconds until the earliest deadline of a live job (negative: passed), by the
        database's clock; None when no live job has a deadline (index jobs_deadline)."""
        return await self._read("next_deadline", control.next_deadline)

    # ---- tiles ----------------------------------------------------------------------------

    async def plan_tiles(
        self,
        job_id: str,
        rects: Sequence[tuple[int, int, int, int]],
        *,
        node: str = "",
        tile_size: int | None = None,
    ) -> list[Tile]:
        """Insert the plan (idempotent), set ``tiles_total``, TILES_PLANNED; all the tiles.

        A different plan for an already planned job is a ConflictError. ``tile_size``: the edge
        of ``rects``, which an auto job with no edge yet takes (:func:`.tiles.plan`).
        """
        return await self._tx(
            "plan_tiles",
            lambda c: tiles.plan(c, job_id, rects, Who(node), tile_size=tile_size),
        )

    async def tile_cost(
        self, job_id: str, cost_key: str | None, renderer: str
    ) -> costs.CostEstimate | None:
        """Measured seconds per pixel-sample for a job's tiles (:func:`.costs.tile_cost`)."""
        return await self._read(
            "tile_cost", lambda c: costs.tile_cost(c, job_id, cost_key, renderer)
        )

    async def get_tile(self, job_id: str, tile_index: int) -> Tile | None:
        """The tile, or ``None``."""
        return await self._read("get_tile", lambda c: tiles.fetch_tile(c, job_id, tile_index))

    async def list_tiles(self, job_id: str) -> list[Tile]:
        """The job's tiles in index order."""
        return await self._read("list_tiles", lambda c: tiles.list_tiles(c, job_id))

    async def mark_published(
        self, job_id: str, tile_indexes: Sequence[int], generation: int
    ) -> None:
        """Stamp ``published_at`` and the message ``generation`` on the tiles."""
        await self._tx(
            "mark_published", lambda c: tiles.mark_published(c, job_id, tile_indexes, generation)
        )

    async def release_tiles(
        self,
        capacity: Mapping[str, int],
        *,
        limit: int,
        usage_window: float,
        run: Callable[[str, int, int], int] | None = None,
        most: int = 1,
    ) -> dispatch.Released:
        """The dispatcher's round, one transaction (:func:`shared.metadata.dispatch.release`):
        up to ``limit`` unreleased queued tiles of dispatchable jobs, within each renderer's
        window (``capacity`` minus its released-and-unfinished messages: ``run(renderer, spp,
        tile pixels)`` tiles of a job share one, at most ``most``), highest priority first,
        fair share between projects (core-seconds over ``usage_window`` s) within a priority,
        oldest job first within a project; stamped ``generation + 1``, ``published_at = now()``.
        Dispatchers of several schedulers take turns (a transaction-scoped advisory lock)."""
        return await self._tx(
            "release_tiles",
            lambda c: dispatch.release(
                c,
                capacity,
                limit=limit,
                usage_window=usage_window,
                run=run or dispatch.single,
                most=most,
            ),
        )

    async def unreleased_tiles(self) -> int:
        """Unreleased queued tiles of dispatchable jobs (the dispatch backlog)."""
        return await self._read("unreleased_tiles", dispatch.unreleased)

    async def tile_seconds(self, window: float) -> dict[str, float]:
        """``renderer -> mean seconds`` of its tile attempts done in the last ``window`` s."""
        return await self._read("tile_seconds", lambda c: dispatch.tile_seconds(c, window))

    async def fence_first(
        self, job_id: str, tile_index: int, *, token: int, attempt_id: str, node: str,
        generation: int,
    ) -> FirstFence:  # fmt: skip
        """The worker's first move on a tile it holds the lease of: one statement
        (:func:`.fastpath.fence`) that fences a never-leased tile for a message of
        ``generation`` or newer, and returns the row as it was either way.

        Not fenced (nothing written): the caller decides from the row — a done, final or
        superseded tile has nothing to render; any other case (a retry, a takeover, the job's
        TILE_STARTED move, a resume) goes on to :meth:`fence_tile`.
        """
        lease = TileFence(job_id, tile_index, token, attempt_id, node)
        first = await self._fences.call((lease, generation))
        if first is None:  # lost a deadlock or serialization race: nothing written
            return FirstFence(False, await self.get_tile(job_id, tile_index))
        return first

    async def _fence_batch(
        self, calls: Sequence[tuple[TileFence, int]]
    ) -> Sequence[FirstFence | None]:
        fenced = await self._statement("fence_first", lambda c: fastpath.fence_many(c, calls))
        return [None] * len(calls) if fenced is None else fenced

    async def fence_tile(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int,
        attempt_id: str,
        node: str,
        resumed_from: int = 0,
    ) -> bool:
        """Write the lease's fencing token (``lease_fence < token``), LEASE, record the attempt.

        Also moves the job by TILE_STARTED. False (nothing written) for a stale token, a
        done/terminal tile, or a terminal or cancel-requested job. One transaction
        (:func:`.fencing.fence`); the plain case goes through :meth:`fence_first` instead.
        """
        lease = TileFence(job_id, tile_index, token, attempt_id, node, resumed_from)
        return await self._tx("fence_tile", lambda c: fencing.fence(c, lease))

    async def record_progress(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int,
        samples_done: int,
        node: str = "",
        attempt_id: str | None = None,
    ) -> bool:
        """Fenced ``samples_done`` update (PROGRESS on the first); False if the fence is lost."""
        who = Who(node, attempt_id)
        return await self._tx(
            "record_progress",
            lambda c: fencing.progress(
                c, job_id, tile_index, token=token, samples_done=samples_done, who=who
            ),
        )

    async def commit_tile(self, done: TileCommit) -> CommitOutcome:
        """The fenced commit (``lease_fence = token AND state <> 'done'``) in one transaction.

        COMMITTED: tile done, attempt closed as done, audited, job moved by TILE_PROGRESS
        (skipped if the job is already terminal). ALREADY_DONE / FENCED: nothing but the
        attempt's ``fenced`` outcome is written. The common case takes one statement
        (:mod:`.fastpath`); the transaction (:func:`.fencing.commit`) takes the rest.
        """
        if await self._commits.call(done):
            return CommitOutcome.COMMITTED
        return await self._tx("commit_tile", lambda c: fencing.commit(c, done))

    async def _commit_batch(self, dones: Sequence[TileCommit]) -> Sequence[bool | None]:
        committed = await self._statement("commit_tile", lambda c: fastpath.commit_many(c, dones))
        return [None] * len(dones) if committed is None else committed

    async def result_lost(
        self,
        job_id: str,
        tile_indexes: Sequence[int],
        *,
        error: str,
        node: str = "",
        attempt_id: str | None = None,
    ) -> list[int]:
        """RESULT_LOST in one transaction: the job from ``finalizing`` back to rendering, the
        named ``done`` tiles back to ``queued`` (result forgotten) to be rendered again."""
        who = Who(node, attempt_id, "result_lost", error)
        return await self._tx(
            "result_lost", lambda c: tiles.result_lost(c, job_id, tile_indexes, who)
        )

    async def result_refs(self, job_id: str) -> list[TileResultRef]:
        """Where each of the job's tiles' results is (object key or inline), in index order."""
        return await self._read("result_refs", lambda c: tiles.result_refs(c, job_id))

    async def tile_results(self, job_id: str) -> dict[int, tuple[str, bytes]]:
        """The job's inline tile results: ``tile_index -> (sha256, data)``."""
        return await self._read("tile_results", lambda c: tiles.inline_results(c, job_id))

    async def fail_tile(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int | None,
        attempt_id: str | None,
        trigger: TileTrigger,
        error_code: str,
        error: str,
        node: str,
        outcome: AttemptOutcome | str,
        job_trigger: JobTrigger | None = None,
    ) -> Tile | None:
        """Move the tile by ``trigger`` (retryable, terminal, lease_lost, cancel, dead_letter).

        With ``token`` the move is fenced: a stale owner gets ``None`` and changes nothing.
        The attempt (if any) gets ``outcome``; the move is audited. ``job_trigger``, if given,
        moves the job in the same transaction (skipped when the job's state does not allow it).
        """
        who = Who(node, attempt_id, error_code, error)
        # Checked before the transaction; with no attempt there is nothing to record it on.
        checked = None if attempt_id is None else audit.outcome_of(outcome)
        return await self._tx(
            "fail_tile",
            lambda c: fencing.fail(
                c,
                job_id,
                tile_index,
                token=token,
                trigger=trigger,
                outcome=checked,
                job_trigger=job_trigger,
                who=who,
            ),
        )

    async def end_attempt(
        self,
        attempt_id: str,
        *,
        outcome: AttemptOutcome | str,
        error_code: str | None = None,
        error: str | None = None,
    ) -> None:
        """Close an attempt; the first outcome wins, later calls change nothing."""
        await self._tx(
            "end_attempt",
            lambda c: audit.end_attempt(c, attempt_id, outcome, error_code=error_code, error=error),
        )

    async def start_final_attempt(
        self, job_id: str, *, attempt_id: str, node: str, fence: int
    ) -> None:
        """Record a finalization attempt (idempotent per ``attempt_id``)."""

        async def run(conn: Conn) -> None:
            await jobs.state_of(conn, job_id)  # NotFoundError rather than a foreign-key error
            await audit.start_attempt(
                conn, job_id, None, attempt_id=attempt_id, node=node, fence=fence
            )

        await self._tx("start_final_attempt", run)

    # ---- queries --------------------------------------------------------------------------

    async def tile_counts(self, job_id: str) -> TileCounts:
        """Total, done, per-state counts and the ``samples_done`` sum of the job's tiles."""
        return await self._read("tile_counts", lambda c: tiles.counts(c, job_id))

    async def all_tiles_done(self, job_id: str) -> bool:
        """True once the job is planned and every tile is done."""
        return await self._read("all_tiles_done", lambda c: tiles.all_done(c, job_id))

    async def completed_by(self, job_id: str) -> int | None:
        """None until the job is planned and every tile is done; then the newest lease fence
        among its tiles (:func:`shared.metadata.tiles.completed_by`)."""
        answer = await self._completions.call(job_id)
        if isinstance(answer, NotFoundError):
            raise answer
        return answer

    async def _completed_by_batch(
        self, job_ids: Sequence[str]
    ) -> Sequence[int | NotFoundError | None]:
        return await self._read("completed_by", lambda c: tiles.completed_by_many(c, job_ids))

    async def stale_tiles(
        self, *, older_than: float, limit: int = 100, after: tiles.StaleKey | None = None
    ) -> list[Tile]:
        """For the sweeper: open tiles of live, not cancel-requested jobs whose message was
        last published more than ``older_than`` seconds ago, or that were never published and
        have not moved for as long (a fresh plan is still being published), oldest first; with
        ``after`` (:func:`~shared.metadata.tiles.stale_key` of the last tile of a page), the
        next page."""
        return await self._read(
            "stale_tiles",
            lambda c: tiles.stale(c, older_than=older_than, limit=limit, after=after),
        )

    async def claim_lost_tiles(self, seen: Sequence[Tile], *, older_than: float) -> list[Tile]:
        """For the sweeper, right before it re-publishes: of the tiles ``seen`` (as
        :meth:`stale_tiles` returned them), those still stale whose row has not changed since,
        moved to the next generation with ``published_at = now()`` in the same statement; the
        claimed rows (new generation). A tile done, fenced, progressed or published meanwhile,
        or of a job settled or cancel-requested meanwhile, is left alone."""
        return await self._tx(
            "claim_lost_tiles", lambda c: tiles.claim_lost(c, seen, older_than=older_than)
        )

    async def stale_queued_jobs(self, *, older_than: float, limit: int = 100) -> list[Job]:
        """For the sweeper: jobs still ``queued`` with no tiles planned, untouched for more than
        ``older_than`` seconds (their JOBS message was lost, e.g. a gateway died between the
        insert and the publish), oldest first. Their scenes are left out of the rows."""
        return await self._read(
            "stale_queued_jobs", lambda c: jobs.stale_queued(c, older_than=older_than, limit=limit)
        )

    async def unfinalized_jobs(
        self, *, older_than: float, limit: int = 100
    ) -> list[tuple[str, int]]:
        """For the sweeper: ``(job_id, completion)`` of jobs whose tiles have all been done for
        more than ``older_than`` seconds while no finalizer took them
        (:func:`shared.metadata.tiles.unfinalized`)."""
        return await self._read(
            "unfinalized_jobs",
            lambda c: tiles.unfinalized(c, older_than=older_than, limit=limit),
        )

    async def job_events(self, job_id: str) -> list[AuditEvent]:
        """The job's audit trail (job and tile rows), oldest first."""
        return await self._read("job_events", lambda c: audit.events_of(c, job_id))

    async def attempts(self, job_id: str) -> list[Attempt]:
        """The job's attempts in start order."""
        return await self._read("attempts", lambda c: audit.attempts_of(c, job_id))


def _tile_key(call: tuple[TileFence, int]) -> tuple[str, int]:
    return call[0].job_id, call[0].tile_index


def _commit_key(done: TileCommit) -> tuple[str, int]:
    return done.job_id, done.tile_index
