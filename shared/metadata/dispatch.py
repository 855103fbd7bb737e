"""The dispatcher's release: unreleased queued tiles of dispatchable jobs into ``TILES``.

One transaction (:func:`release`):

1. ``pg_advisory_xact_lock(DISPATCH_LOCK)``: dispatchers (one per scheduler) release one at a
   time, so each counts the tiles the previous one released and the window holds across them;
2. one statement (:func:`_standing`) reads the released-and-unfinished tiles per renderer and
   project, the waiting jobs and their projects' weights and caps;
3. the window per renderer: its ``capacity`` (from the live workers) minus its in-flight
   messages: a job's ``n`` released-and-unfinished tiles are ``ceil(n / run)`` messages, where
   its tiles go ``run`` to a message (``run`` is the caller's function of the renderer, the
   samples per pixel and the tile's pixels: the dispatcher's
   :func:`shared.core.runs.run_length`; a worker holds a message until its last tile is done);
4. with more than one project waiting, read their usage; then
   :func:`shared.core.fairshare.plan_release` decides how many tiles each job gets;
5. stamp them in one statement that takes the rows ``FOR UPDATE SKIP LOCKED`` (a row a cancel
   or pause is writing is left for the next round) and re-checks the job in the statement's own
   snapshot: ``generation + 1``, ``published_at = now()``.

The caller publishes the returned tiles after the commit, each under ``tile:<job>:<i>:<gen>``;
a crash in between leaves released tiles with no message, which the sweeper re-publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from shared.core.fairshare import ProjectShare, Waiting, plan_release
from shared.core.lifecycle import TERMINAL_JOB_STATES, TERMINAL_TILE_STATES, JobState, TileState
from shared.metadata.audit import Conn
from shared.metadata.models import Tile

__all__ = [
    "DISPATCHABLE",
    "DISPATCH_LOCK",
    "Released",
    "release",
    "single",
    "tile_seconds",
    "unreleased",
]

DISPATCH_LOCK = int.from_bytes(b"tessdisp", "big") & 0x7FFF_FFFF_FFFF_FFFF
"""``pg_advisory_xact_lock`` key of a release (ASCII "tessdisp"); the migrations use another."""

DISPATCHABLE = (JobState.QUEUED, JobState.RUNNING, JobState.PROGRESSING, JobState.FAILED_RETRYABLE)
"""Job states whose tiles are released (also: not cancel-requested, not past the deadline)."""

DEFAULT_ESTIMATE = 1.0
"""Core-seconds one tile is assumed to cost when no attempt ended inside the window."""

_TERMINAL_JOBS = [s.value for s in TERMINAL_JOB_STATES]
_TERMINAL_TILES = [s.value for s in TERMINAL_TILE_STATES]
_DISPATCHABLE = [s.value for s in DISPATCHABLE]
_QUEUED = TileState.QUEUED.value

#: the pixels of a whole tile of job row ``j`` (its tiles' largest: a frame smaller than the edge
#: is one tile)
_TILE_PIXELS = "LEAST(j.tile_size, j.width)::bigint * LEAST(j.tile_size, j.height)"

#: a dispatchable job row ``j``; $1 is :data:`_DISPATCHABLE`
JOB_DISPATCHABLE = """
    j.state = ANY($1::text[]) AND NOT j.cancel_requested
    AND (j.deadline_at IS NULL OR j.deadline_at > now())
"""


@dataclass(frozen=True)
class Released:
    """What one release did: the tiles stamped (new generation) and the windows it saw."""

    tiles: list[Tile] = field(default_factory=list)
    #: renderer -> messages it could still take before this release
    windows: dict[str, int] = field(default_factory=dict)
    #: job_id -> renderer of the jobs released from
    renderers: dict[str, str] = field(default_factory=dict)
    #: job_id -> tiles per message of the jobs released from, where more than one
    runs: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Standing:
    """What a round reads in one statement after the lock (:func:`_standing`)."""

    #: ``(renderer, project, released and unfinished, of them not started, samples per pixel,
    #: pixels of a whole tile)`` of each live job
    held: list[tuple[str, str, int, int, int, int]]
    #: dispatchable jobs with unreleased queued tiles (counted up to the statement's cap)
    waiting: list[Waiting]
    #: project -> ``(weight, max_in_flight)`` of the waiting jobs' configured projects
    settings: dict[str, tuple[float, int | None]]
    #: job_id -> ``(samples per pixel, pixels of a whole tile)`` of the waiting jobs
    shape: dict[str, tuple[int, int]]


#: the in-flight counts, the waiting jobs and their projects' settings, one statement: a round
#: is a round trip fewer twice over (the three reads were one statement each). Rows with a
#: ``job_id`` are waiting jobs, the others in-flight counts. $1 dispatchable job states, $2
#: terminal tile states, $3 terminal job states, $4 renderers, $5 the count's cap. In-flight
#: counts are per job, with its tile shape (samples per pixel, pixels of a whole tile: what
#: decides how many of its tiles share a message).
_STANDING = f"""
WITH held AS (
  SELECT j.renderer, j.project, count(*) AS n,
         count(*) FILTER (WHERE t.state = '{_QUEUED}') AS unstarted,
         j.spp, {_TILE_PIXELS} AS pixels
  FROM tiles t JOIN jobs j ON j.job_id = t.job_id
  WHERE t.published_at IS NOT NULL AND t.state <> ALL($2::text[])
    AND j.state <> ALL($3::text[])
  GROUP BY j.job_id, j.renderer, j.project, j.spp, pixels
), waiting AS (
  SELECT * FROM (
    SELECT j.job_id, j.project, j.priority, j.created_at, j.renderer, j.spp,
           {_TILE_PIXELS} AS pixels,
           (SELECT count(*) FROM (
              SELECT 1 FROM tiles t
              WHERE t.job_id = j.job_id AND t.published_at IS NULL AND t.state = '{_QUEUED}'
              LIMIT $5) s) AS waiting
    FROM jobs j
    WHERE {JOB_DISPATCHABLE} AND j.renderer = ANY($4::text[])
  ) w WHERE w.waiting > 0
)
SELECT NULL::text AS job_id, h.project, NULL::integer AS priority,
       NULL::timestamptz AS created_at, h.renderer, h.n, h.unstarted,
       NULL::double precision AS weight, NULL::integer AS max_in_flight, false AS configured,
       h.spp, h.pixels
FROM held h
UNION ALL
SELECT w.job_id, w.project, w.priority, w.created_at, w.renderer, w.waiting, 0,
       p.weight, p.max_in_flight, p.name IS NOT NULL, w.spp, w.pixels
FROM waiting w LEFT JOIN projects p ON p.name = w.project
"""


async def _standing(conn: Conn, renderers: list[str], cap: int) -> _Standing:
    """The in-flight tiles, the waiting jobs of ``renderers`` and their projects' settings."""
    rows = await conn.fetch(
        _STANDING, _DISPATCHABLE, _TERMINAL_TILES, _TERMINAL_JOBS, renderers, cap
    )
    held: list[tuple[str, str, int, int, int, int]] = []
    waiting: list[Waiting] = []
    settings: dict[str, tuple[float, int | None]] = {}
    shape: dict[str, tuple[int, int]] = {}
    for r in rows:
        if r["job_id"] is None:
            held.append((r["renderer"], r["project"], int(r["n"]), int(r["unstarted"]),
                         int(r["spp"]), int(r["pixels"])))  # fmt: skip
            continue
        waiting.append(Waiting(r["job_id"], r["project"], r["priority"], r["created_at"],
                               r["renderer"], int(r["n"])))  # fmt: skip
        shape[r["job_id"]] = (int(r["spp"]), int(r["pixels"]))
        if r["configured"]:
            settings[r["project"]] = (float(r["weight"]), r["max_in_flight"])
    return _Standing(held, waiting, settings, shape)


async def _usage(conn: Conn, projects: list[str], window: float) -> tuple[dict[str, float], float]:
    """Kernel core-seconds per project over the last ``window`` s, and the mean tile attempt.

    An attempt counts for the part of it inside the window: one that ended there, or one still
    open whose tile it holds (an open attempt of a crashed worker whose tile moved on does not
    count). One attempt runs its passes on one kernel thread at a time, so its wall time is its
    core-seconds (a worker with more tiles in hand than threads inflates every project alike).
    """
    rows = await conn.fetch(
        """
        WITH spans AS (
          SELECT a.job_id, a.started_at, a.ended_at FROM attempts a
          WHERE a.kind = 'tile' AND a.ended_at > now() - make_interval(secs => $2)
          UNION ALL
          SELECT a.job_id, a.started_at, NULL FROM attempts a
            JOIN tiles t ON t.job_id = a.job_id AND t.tile_index = a.tile_index
          WHERE a.ended_at IS NULL AND a.kind = 'tile' AND t.lease_fence = a.fence
            AND t.state IN ('leased', 'progressing')
        )
        SELECT j.project, sum(GREATEST(0, extract(epoch FROM
                 COALESCE(s.ended_at, now()) - GREATEST(s.started_at,
                                                        now() - make_interval(secs => $2)))))
               AS seconds
        FROM spans s JOIN jobs j ON j.job_id = s.job_id
        WHERE j.project = ANY($1::text[])
        GROUP BY j.project
        """,
        projects,
        window,
    )
    mean = await conn.fetchval(
        """
        SELECT avg(extract(epoch FROM ended_at - started_at)) FROM attempts
        WHERE kind = 'tile' AND ended_at > now() - make_interval(secs => $1) AND outcome = 'done'
        """,
        window,
    )
    estimate = float(mean) if mean is not None and mean > 0 else DEFAULT_ESTIMATE
    return {r["project"]: float(r["seconds"]) for r in rows}, estimate


async def _stamp(conn: Conn, picks: Mapping[str, int]) -> list[Tile]:
    """Release the lowest unreleased indexes of each picked job: the stamped rows."""
    rows = await conn.fetch(
        f"""
        UPDATE tiles t SET generation = t.generation + 1, published_at = now()
        FROM (
          SELECT u.job_id, u.tile_index
          FROM unnest($2::text[], $3::integer[]) AS p(job_id, n)
          CROSS JOIN LATERAL (
            SELECT x.job_id, x.tile_index FROM tiles x JOIN jobs j ON j.job_id = x.job_id
            WHERE x.job_id = p.job_id AND x.published_at IS NULL AND x.state = '{_QUEUED}'
              AND {JOB_DISPATCHABLE}
            ORDER BY x.tile_index LIMIT p.n
            FOR UPDATE OF x SKIP LOCKED) u
        ) s
        WHERE t.job_id = s.job_id AND t.tile_index = s.tile_index
        RETURNING t.*
        """,
        _DISPATCHABLE,
        list(picks),
        list(picks.values()),
    )
    return sorted((Tile.from_record(r) for r in rows), key=lambda t: (t.job_id, t.tile_index))


def single(renderer: str, spp: int, pixels: int) -> int:
    """Every tile its own message."""
    return 1


async def release(
    conn: Conn,
    capacity: Mapping[str, int],
    *,
    limit: int,
    usage_window: float,
    run: Callable[[str, int, int], int] = single,
    most: int = 1,
) -> Released:
    """One release round (see the module docstring); at most ``limit`` tiles. ``run(renderer,
    spp, tile pixels)``: how many tiles of such a job share a message (1 to ``most``)."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", DISPATCH_LOCK)
    # (the waiting jobs are read for every renderer with a capacity, counted up to the most
    # tiles a round can release, so one statement serves before the budgets are known)
    cap = max((min(c * max(1, most), limit) for c in capacity.values()), default=0)
    standing = await _standing(conn, sorted(capacity), cap)
    held = standing.held
    per_renderer: dict[str, int] = {}
    for renderer, _, count, _, spp, pixels in held:
        messages = -(-count // max(1, run(renderer, spp, pixels)))
        per_renderer[renderer] = per_renderer.get(renderer, 0) + messages
    windows = {r: max(0, c - per_renderer.get(r, 0)) for r, c in capacity.items()}
    budgets = {r: w for r, w in windows.items() if w > 0}
    waiting = [
        replace(w, run=max(1, run(w.renderer, *standing.shape[w.job_id])))
        for w in standing.waiting
        if w.renderer in budgets
    ]
    if not waiting:
        return Released(windows=windows)
    names = sorted({w.project for w in waiting})
    # One project waiting: its usage orders nothing (its own cap still applies).
    usage, estimate = (
        await _usage(conn, names, usage_window) if len(names) > 1 else ({}, DEFAULT_ESTIMATE)
    )
    settings = standing.settings
    in_flight: dict[str, int] = {}
    unstarted: dict[str, int] = {}
    for _, project, count, queued, _, _ in held:
        in_flight[project] = in_flight.get(project, 0) + count
        unstarted[project] = unstarted.get(project, 0) + queued
    projects = {
        p: ProjectShare(
            weight=settings.get(p, (1.0, None))[0],
            max_in_flight=settings.get(p, (1.0, None))[1],
            in_flight=in_flight.get(p, 0),
            usage=usage.get(p, 0.0) + estimate * unstarted.get(p, 0),
        )
        for p in names
    }
    picks = plan_release(waiting, budgets, projects, estimate, limit=limit)
    tiles = await _stamp(conn, picks) if picks else []
    renderers = {w.job_id: w.renderer for w in waiting if w.job_id in picks}
    runs = {w.job_id: w.run for w in waiting if w.job_id in picks and w.run > 1}
    return Released(tiles=tiles, windows=windows, renderers=renderers, runs=runs)


async def unreleased(conn: Conn) -> int:
    """Unreleased queued tiles of dispatchable jobs (the dispatcher's backlog gauge)."""
    value = await conn.fetchval(
        f"""
        SELECT count(*) FROM tiles t JOIN jobs j ON j.job_id = t.job_id
        WHERE t.published_at IS NULL AND t.state = '{_QUEUED}' AND {JOB_DISPATCHABLE}
        """,
        _DISPATCHABLE,
    )
    return int(value or 0)


async def tile_seconds(conn: Conn, window: float) -> dict[str, float]:
    """``renderer -> mean seconds`` of the tile attempts done in the last ``window`` s, lease to
    commit (the dispatcher's buffer for short tiles); a renderer with none is absent."""
    rows = await conn.fetch(
        """
        SELECT j.renderer, avg(extract(epoch FROM a.ended_at - a.started_at)) AS seconds
        FROM attempts a JOIN jobs j ON j.job_id = a.job_id
        WHERE a.kind = 'tile' AND a.outcome = 'done'
          AND a.ended_at > now() - make_interval(secs => $1)
        GROUP BY j.renderer
        """,
        window,
    )
    return {r["renderer"]: float(r["seconds"]) for r in rows if r["seconds"] is not None}
