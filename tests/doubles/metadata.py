"""The metadata operations of a tile run and the scheduler, in memory.

What :class:`shared.metadata.MetadataStore` promises for the methods below, without a server:
every state move through :mod:`shared.core.lifecycle`'s pure functions (an illegal move raises
:class:`~shared.core.lifecycle.IllegalTransition` and changes nothing), the owner's writes fenced
(``lease_fence < token`` to fence, ``lease_fence == token`` for everything after), a refused
commit told ALREADY_DONE from FENCED and closing the attempt as ``fenced``, and an attempt's
first outcome winning. No audit trail, no inline results, no operator queries: what the tile
run and the scheduler do not read. ``tests/doubles/test_metadata_contract.py`` holds it to the
real store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from shared.core.errors import ConflictError, NotFoundError, ValidationError
from shared.core.fairshare import ProjectShare, Waiting, plan_release
from shared.core.lifecycle import (
    IllegalTransition,
    JobState,
    JobTrigger,
    TileState,
    TileTrigger,
    is_terminal,
    tile_legal_events,
    transition_job,
    transition_tile,
)
from shared.metadata import (
    Attempt,
    AttemptOutcome,
    CommitOutcome,
    FirstFence,
    Job,
    JobControl,
    NewJob,
    SubmitResult,
    Tile,
    TileCommit,
    fastpath,
)
from shared.metadata.costs import (
    COST_JOBS,
    COST_MIN_ATTEMPTS,
    COST_MIN_SECONDS,
    COST_SAMPLE,
    CostEstimate,
)
from shared.metadata.dispatch import DEFAULT_ESTIMATE, DISPATCHABLE, Released
from shared.metadata.store import CANCEL_IF_IDLE
from shared.metadata.tiles import EdgeChosen

__all__ = ["MemoryMetadata"]


def _now() -> datetime:
    return datetime.now(UTC)


def _outcome(value: AttemptOutcome | str) -> AttemptOutcome:
    try:
        return AttemptOutcome(value)
    except ValueError:
        raise ValidationError(f"attempt outcome {value!r} is not an AttemptOutcome") from None


class MemoryMetadata:
    """Jobs, tiles and attempts in dicts; the subset of ``MetadataStore`` the services use."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.tiles: dict[tuple[str, int], Tile] = {}
        self.attempt_rows: dict[str, Attempt] = {}
        #: project -> (weight, max_in_flight), as rows of ``projects``
        self.projects: dict[str, tuple[float, int | None]] = {}

    # ---- jobs -----------------------------------------------------------------------------

    async def submit_job(self, new: NewJob) -> SubmitResult:
        for job in self.jobs.values():
            if job.idempotency_key == new.idempotency_key:
                if job.fingerprint != new.fingerprint:
                    raise ConflictError(f"idempotency key {new.idempotency_key!r} is bound")
                return SubmitResult(job, created=False)
        now = _now()
        fields = {f.name: getattr(new, f.name) for f in dataclasses.fields(NewJob)}
        job = Job(**fields, tiles_total=0, state=JobState.QUEUED, generation=0,
                  cancel_requested=False, result_location=None, result_sha256=None,
                  float_location=None, last_error_code=None, last_error=None, created_at=now,
                  updated_at=now, finished_at=None)  # fmt: skip
        self.jobs[job.job_id] = job
        return SubmitResult(job, created=True)

    async def get_job(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def _job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} does not exist")
        return job

    def _move_job(
        self,
        job_id: str,
        trigger: JobTrigger,
        *,
        error_code: str | None = None,
        error: str | None = None,
    ) -> Job:
        job = self._job(job_id)
        target = transition_job(job.state, trigger)
        changes: dict[str, object] = {
            "last_error_code": job.last_error_code if error_code is None else error_code,
            "last_error": job.last_error if error is None else error,
        }
        if target != job.state:
            changes |= {"state": target, "finished_at": _now() if is_terminal(target) else None}
        if target != job.state or error_code is not None or error is not None:
            changes["updated_at"] = _now()
        self.jobs[job_id] = moved = dataclasses.replace(job, **changes)  # type: ignore[arg-type]
        return moved

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
        job = self._job(job_id)
        if expected is not None:
            transition_job(expected, trigger)  # illegal from ``expected``: say so first
            if job.state != expected:
                raise IllegalTransition(f"job {job_id}: expected {expected}, is {job.state}")
        return self._move_job(job_id, trigger, error_code=error_code, error=error)

    async def request_cancel(self, job_id: str, *, node: str = "") -> Job:
        self._move_job(job_id, JobTrigger.CANCEL)
        self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], cancel_requested=True)
        for key, tile in self.tiles.items():
            if key[0] == job_id and tile.state in CANCEL_IF_IDLE:
                self._put_tile(tile, state=transition_tile(tile.state, TileTrigger.CANCEL))
        return self.jobs[job_id]

    async def is_cancel_requested(self, job_id: str) -> bool:
        return self._job(job_id).cancel_requested

    async def job_control(self, job_id: str) -> JobControl:
        job = self._job(job_id)
        return JobControl(job.state, job.cancel_requested, job.deadline_at, job.last_error_code)

    async def unrelease_tile(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int | None,
        attempt_id: str | None = None,
        node: str = "",
    ) -> bool:
        job, tile = self._job(job_id), self._tile(job_id, tile_index)
        working = tile.state in (TileState.LEASED, TileState.PROGRESSING)
        ours = tile.lease_fence <= token if token is not None else not working
        if job.state is not JobState.PAUSED or not ours:
            return False
        if TileTrigger.PAUSE not in tile_legal_events(tile.state):
            return False
        self._put_tile(
            tile, state=transition_tile(tile.state, TileTrigger.PAUSE), published_at=None,
            generation=tile.generation + 1,
        )  # fmt: skip
        self._end(attempt_id, AttemptOutcome.PAUSED, None, None)
        return True

    # ---- tiles ----------------------------------------------------------------------------

    async def plan_tiles(
        self,
        job_id: str,
        rects: Sequence[tuple[int, int, int, int]],
        *,
        node: str = "",
        tile_size: int | None = None,
    ) -> list[Tile]:
        if not rects or any(x1 <= x0 or y1 <= y0 or min(x0, y0) < 0 for x0, y0, x1, y1 in rects):
            raise ValidationError("plan: a job needs non-empty tiles")
        job = self._job(job_id)
        if tile_size is not None and job.tile_size != tile_size:
            if job.tile_size != 0:
                raise EdgeChosen(f"job {job_id}: its tile edge is {job.tile_size}")
            self.jobs[job_id] = job = dataclasses.replace(job, tile_size=tile_size)
        if job.tiles_total not in (0, len(rects)):
            raise ConflictError(f"job {job_id} is planned with {job.tiles_total} tiles")
        try:
            self._move_job(job_id, JobTrigger.TILES_PLANNED)
        except IllegalTransition:
            if job.tiles_total == 0:
                raise
        now = _now()
        for i, (x0, y0, x1, y1) in enumerate(rects):
            self.tiles.setdefault((job_id, i), Tile(
                job_id, i, x0, y0, x1, y1, state=TileState.QUEUED, lease_fence=0, generation=0,
                samples_done=0, result_key=None, result_sha256=None, attempt_count=0,
                last_error_code=None, last_error=None, published_at=None, updated_at=now,
            ))  # fmt: skip
        self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], tiles_total=len(rects))
        tiles = await self.list_tiles(job_id)
        if [tuple(t.rect) for t in tiles] != [tuple(r) for r in rects]:
            raise ConflictError(f"job {job_id} is already planned with different rectangles")
        return tiles

    async def get_tile(self, job_id: str, tile_index: int) -> Tile | None:
        return self.tiles.get((job_id, tile_index))

    async def tile_cost(
        self, job_id: str, cost_key: str | None, renderer: str
    ) -> CostEstimate | None:
        scopes = [("scene", lambda j: j.cost_key == cost_key)] if cost_key is not None else []
        scopes.append(("renderer", lambda j: j.renderer == renderer))
        for scope, same in scopes:
            done = [a for a in self.attempt_rows.values() if a.kind == "tile"
                    and a.outcome is AttemptOutcome.DONE and a.ended_at is not None
                    and _render_seconds(a) >= COST_MIN_SECONDS]  # fmt: skip
            jobs = sorted((j for j in self.jobs.values() if same(j) and j.job_id != job_id
                           and any(a.job_id == j.job_id for a in done)),
                          key=lambda j: j.created_at, reverse=True)[:COST_JOBS]  # fmt: skip
            spp = {j.job_id: j.spp for j in jobs}
            costs = []
            mine = sorted((a for a in done if a.job_id in spp),
                          key=lambda a: a.ended_at or a.started_at, reverse=True)  # fmt: skip
            for a in mine[:COST_SAMPLE]:
                assert a.tile_index is not None and a.ended_at is not None
                x0, y0, x1, y1 = self.tiles[(a.job_id, a.tile_index)].rect
                work = (x1 - x0) * (y1 - y0) * max(spp[a.job_id] - a.resumed_from, 1)
                costs.append(_render_seconds(a) / work)
            if len(costs) >= COST_MIN_ATTEMPTS:
                return CostEstimate(statistics.median(costs), len(costs), scope)
        return None

    async def completed_by(self, job_id: str) -> int | None:
        job = self._job(job_id)
        tiles = [t for (j, _), t in self.tiles.items() if j == job_id]
        if job.tiles_total == 0 or any(t.state is not TileState.DONE for t in tiles):
            return None
        return max(t.lease_fence for t in tiles)

    async def list_tiles(self, job_id: str) -> list[Tile]:
        return sorted((t for k, t in self.tiles.items() if k[0] == job_id),
                      key=lambda t: t.tile_index)  # fmt: skip

    def _tile(self, job_id: str, tile_index: int) -> Tile:
        tile = self.tiles.get((job_id, tile_index))
        if tile is None:
            raise NotFoundError(f"tile {tile_index} of job {job_id} does not exist")
        return tile

    def _put_tile(self, tile: Tile, **changes: object) -> Tile:
        moved = dataclasses.replace(tile, **changes, updated_at=_now())  # type: ignore[arg-type]
        self.tiles[tile.job_id, tile.tile_index] = moved
        return moved

    async def mark_published(
        self, job_id: str, tile_indexes: Sequence[int], generation: int
    ) -> None:
        for i in tile_indexes:
            if (tile := self.tiles.get((job_id, i))) is not None:
                self.tiles[job_id, i] = dataclasses.replace(
                    tile, published_at=_now(), generation=max(tile.generation, generation)
                )

    # ---- dispatch ---------------------------------------------------------------------------

    def _dispatchable(self, job: Job) -> bool:
        overdue = job.deadline_at is not None and job.deadline_at <= _now()
        return job.state in DISPATCHABLE and not job.cancel_requested and not overdue

    async def release_tiles(
        self,
        capacity: Mapping[str, int],
        *,
        limit: int,
        usage_window: float,
        run: Callable[[str, int, int], int] | None = None,
        most: int = 1,
    ) -> Released:
        live = {j for j, job in self.jobs.items() if not is_terminal(job.state)}
        runs = {j: self._run(job, run) for j, job in self.jobs.items()}
        tiles_held: dict[str, int] = {}
        in_flight: dict[str, int] = {}
        unstarted: dict[str, int] = {}
        for (job_id, _), t in self.tiles.items():
            if t.published_at is None or is_terminal(t.state) or job_id not in live:
                continue
            job = self.jobs[job_id]
            tiles_held[job_id] = tiles_held.get(job_id, 0) + 1
            in_flight[job.project] = in_flight.get(job.project, 0) + 1
            if t.state is TileState.QUEUED:
                unstarted[job.project] = unstarted.get(job.project, 0) + 1
        held: dict[str, int] = {}
        for job_id, count in tiles_held.items():
            renderer = self.jobs[job_id].renderer
            held[renderer] = held.get(renderer, 0) + -(-count // runs[job_id])
        windows = {r: max(0, c - held.get(r, 0)) for r, c in capacity.items()}
        budgets = {r: w for r, w in windows.items() if w > 0}
        cap = max((min(c * max(1, most), limit) for c in capacity.values()), default=0)
        waiting = [
            Waiting(j.job_id, j.project, j.priority, j.created_at, j.renderer, n, runs[j.job_id])
            for j in self.jobs.values()
            if self._dispatchable(j) and j.renderer in budgets
            and (n := min(len(self._unreleased(j.job_id)), cap)) > 0
        ]  # fmt: skip
        many = len({w.project for w in waiting}) > 1
        usage, estimate = self._usage(usage_window) if many else ({}, DEFAULT_ESTIMATE)
        projects = {
            p: ProjectShare(
                weight=self.projects.get(p, (1.0, None))[0],
                max_in_flight=self.projects.get(p, (1.0, None))[1],
                in_flight=in_flight.get(p, 0),
                usage=usage.get(p, 0.0) + estimate * unstarted.get(p, 0),
            )
            for p in {w.project for w in waiting}
        }
        picks = plan_release(waiting, budgets, projects, estimate, limit=limit)
        released: list[Tile] = []
        for job_id, count in picks.items():
            for t in self._unreleased(job_id)[:count]:
                released.append(dataclasses.replace(t, generation=t.generation + 1,
                                                    published_at=_now()))  # fmt: skip
                self.tiles[job_id, t.tile_index] = released[-1]
        renderers = {w.job_id: w.renderer for w in waiting if w.job_id in picks}
        in_runs = {w.job_id: w.run for w in waiting if w.job_id in picks and w.run > 1}
        return Released(sorted(released, key=lambda t: (t.job_id, t.tile_index)), windows,
                        renderers, in_runs)  # fmt: skip

    @staticmethod
    def _run(job: Job, run: Callable[[str, int, int], int] | None) -> int:
        """Tiles per message of ``job`` (its whole tile's pixels, as the store counts them)."""
        if run is None:
            return 1
        pixels = min(job.tile_size, job.width) * min(job.tile_size, job.height)
        return max(1, run(job.renderer, job.spp, pixels))

    def _unreleased(self, job_id: str) -> list[Tile]:
        return sorted((t for (j, _), t in self.tiles.items() if j == job_id
                       and t.published_at is None and t.state is TileState.QUEUED),
                      key=lambda t: t.tile_index)  # fmt: skip

    def _usage(self, window: float) -> tuple[dict[str, float], float]:
        now = _now()
        since = now - timedelta(seconds=window)
        usage: dict[str, float] = {}
        done: list[float] = []
        for a in self.attempt_rows.values():
            tile = self.tiles.get((a.job_id, a.tile_index or 0))
            open_and_held = (
                a.ended_at is None
                and tile is not None
                and tile.state in (TileState.LEASED, TileState.PROGRESSING)
                and tile.lease_fence == a.fence
            )
            if a.kind != "tile" or not (open_and_held or (a.ended_at or since) > since):
                continue
            end = a.ended_at or now
            seconds = max(0.0, (end - max(a.started_at, since)).total_seconds())
            project = self.jobs[a.job_id].project
            usage[project] = usage.get(project, 0.0) + seconds
            if a.ended_at is not None and a.outcome is AttemptOutcome.DONE:
                done.append((a.ended_at - a.started_at).total_seconds())
        mean = sum(done) / len(done) if done else 0.0
        return usage, mean if mean > 0 else DEFAULT_ESTIMATE

    async def unreleased_tiles(self) -> int:
        return sum(len(self._unreleased(j.job_id)) for j in self.jobs.values()
                   if self._dispatchable(j))  # fmt: skip

    async def tile_seconds(self, window: float) -> dict[str, float]:
        since = _now() - timedelta(seconds=window)
        spans: dict[str, list[float]] = {}
        for a in self.attempt_rows.values():
            if a.kind == "tile" and a.outcome is AttemptOutcome.DONE and a.ended_at is not None \
                    and a.ended_at > since:  # fmt: skip
                seconds = (a.ended_at - a.started_at).total_seconds()
                spans.setdefault(self.jobs[a.job_id].renderer, []).append(seconds)
        return {r: sum(s) / len(s) for r, s in spans.items()}

    # ---- the owner's fenced writes --------------------------------------------------------

    async def fence_first(
        self, job_id: str, tile_index: int, *, token: int, attempt_id: str, node: str,
        generation: int,
    ) -> FirstFence:  # fmt: skip
        tile = self.tiles.get((job_id, tile_index))
        if tile is None:
            return FirstFence(False, None)
        job = self._job(job_id)
        plain = (
            tile.attempt_count == 0
            and tile.lease_fence < token
            and tile.generation <= generation
            and TileTrigger.LEASE in tile_legal_events(tile.state)
            and job.state in fastpath.quiet_job_states(JobTrigger.TILE_STARTED)
            and not job.cancel_requested
        )
        if plain:
            await self.fence_tile(job_id, tile_index, token=token, attempt_id=attempt_id,
                                  node=node)  # fmt: skip
        return FirstFence(plain, tile)

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
        tile, job = self._tile(job_id, tile_index), self._job(job_id)
        if job.cancel_requested or is_terminal(job.state) or tile.lease_fence >= token:
            return False
        try:
            target = transition_tile(tile.state, TileTrigger.LEASE)
            transition_job(job.state, JobTrigger.TILE_STARTED)
        except IllegalTransition:
            return False
        self._move_job(job_id, JobTrigger.TILE_STARTED)
        self._put_tile(tile, state=target, lease_fence=token, samples_done=resumed_from,
                       attempt_count=tile.attempt_count + 1)  # fmt: skip
        self.attempt_rows.setdefault(attempt_id, Attempt(
            attempt_id, job_id, tile_index, "tile", node, token, resumed_from,
            started_at=_now(), ended_at=None, outcome=None, error_code=None, error=None,
        ))  # fmt: skip
        return True

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
        tile = self._tile(job_id, tile_index)
        if tile.lease_fence != token:
            return False
        try:
            target = transition_tile(tile.state, TileTrigger.PROGRESS)
        except IllegalTransition:
            return False
        self._put_tile(tile, state=target, samples_done=samples_done)
        return True

    async def commit_tile(self, done: TileCommit) -> CommitOutcome:
        tile = self._tile(done.job_id, done.tile_index)
        self._job(done.job_id)  # NotFoundError first, as the store's join
        if tile.state == TileState.DONE or tile.lease_fence != done.token:
            self._end(done.attempt_id, AttemptOutcome.FENCED)
            already = tile.state == TileState.DONE
            return CommitOutcome.ALREADY_DONE if already else CommitOutcome.FENCED
        try:
            target = transition_tile(tile.state, TileTrigger.COMMIT)
        except IllegalTransition:  # the fence is ours but the lease was lost or handed back
            self._end(done.attempt_id, AttemptOutcome.FENCED)
            return CommitOutcome.FENCED
        # Illegal when e.g. the job is already terminal: the tile's commit still stands.
        with contextlib.suppress(IllegalTransition):
            self._move_job(done.job_id, JobTrigger.TILE_PROGRESS)
        self._put_tile(tile, state=target, result_key=done.result_key,
                       result_sha256=done.result_sha256, samples_done=done.samples_done,
                       last_error_code=None, last_error=None)  # fmt: skip
        self._end(done.attempt_id, AttemptOutcome.DONE, render_seconds=done.render_seconds)
        return CommitOutcome.COMMITTED

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
        checked = None if attempt_id is None else _outcome(outcome)
        tile = self._tile(job_id, tile_index)
        if token is not None and tile.lease_fence != token:
            self._end(attempt_id, AttemptOutcome.FENCED)
            return None
        target = transition_tile(tile.state, trigger)
        if job_trigger is not None:
            with contextlib.suppress(IllegalTransition):  # best effort, as in the store
                self._move_job(job_id, job_trigger, error_code=error_code, error=error)
        moved = self._put_tile(tile, state=target, last_error_code=error_code, last_error=error)
        if checked is not None:
            self._end(attempt_id, checked, error_code, error)
        return moved

    async def end_attempt(
        self,
        attempt_id: str,
        *,
        outcome: AttemptOutcome | str,
        error_code: str | None = None,
        error: str | None = None,
    ) -> None:
        self._end(attempt_id, _outcome(outcome), error_code, error)

    def _end(
        self,
        attempt_id: str | None,
        outcome: AttemptOutcome,
        error_code: str | None = None,
        error: str | None = None,
        render_seconds: float | None = None,
    ) -> None:
        """Close the attempt; the first outcome wins."""
        row = None if attempt_id is None else self.attempt_rows.get(attempt_id)
        if row is None or row.ended_at is not None:
            return
        self.attempt_rows[row.attempt_id] = dataclasses.replace(
            row,
            ended_at=_now(),
            outcome=outcome,
            error_code=error_code,
            error=error,
            render_seconds=render_seconds,
        )

    async def attempts(self, job_id: str) -> list[Attempt]:
        """The job's attempts in start order."""
        return [a for a in self.attempt_rows.values() if a.job_id == job_id]


def _render_seconds(attempt: Attempt) -> float:
    """What a done attempt's passes took (``render_seconds``), else its fence to its end."""
    if attempt.render_seconds is not None:
        return attempt.render_seconds
    assert attempt.ended_at is not None
    return (attempt.ended_at - attempt.started_at).total_seconds()
