"""What a pixel-sample costs, measured on the finished tiles of earlier jobs (``tile_size:
"auto"``, :func:`proto.limits.auto_tile_edge`).

A tile attempt that ended ``done`` rendered ``(x1 - x0) * (y1 - y0)`` pixels from the samples it
resumed from up to the job's spp, in the ``render_seconds`` its passes took on the renderer's
threads or process (schema 10; an older attempt: the time between its fence and its commit,
which on a busy worker also counts the waits for a thread): its cost per pixel-sample is that
time over that work (attempts shorter than
:data:`COST_MIN_SECONDS` are left out, and a scope with fewer than :data:`COST_MIN_ATTEMPTS`
measured says nothing). The estimate is the median over
the newest :data:`COST_SAMPLE` such attempts of the newest :data:`COST_JOBS` jobs with a finished
tile and the same cost key (renderer, scene, bounces), else of the same renderer (any scene);
``None`` when there is none (the caller's configured default applies). The reads walk the two
indexes of migration 7 newest first and the attempts' ``(job_id, started_at)`` index.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.metadata.audit import Conn

__all__ = [
    "COST_JOBS",
    "COST_MIN_ATTEMPTS",
    "COST_MIN_SECONDS",
    "COST_SAMPLE",
    "CostEstimate",
    "tile_cost",
]

COST_JOBS = 16
"""Newest jobs of a key (or renderer) whose finished tiles are measured."""
COST_SAMPLE = 64
"""Newest finished tile attempts the median is taken over."""
COST_MIN_ATTEMPTS = 4
"""Fewer measured attempts in a scope say too little (one may be a worker's first tile, which
also pays for loading the kernel and the scene): the next scope, or the default, applies."""
COST_MIN_SECONDS = 0.1
"""Shorter attempts are left out: their time is mostly the fixed cost of a tile (lease, fence,
commit, ack), not its samples, and would make every pixel-sample look dear (a 64x64 tile at
1 spp renders in a few ms and takes tens of ms end to end)."""

_COST_SQL = """
WITH recent AS (
    SELECT j.job_id, j.spp FROM jobs j
    WHERE {where} AND j.job_id <> $2 AND EXISTS (
        SELECT 1 FROM attempts d
        WHERE d.job_id = j.job_id AND d.kind = 'tile' AND d.outcome = 'done')
    ORDER BY j.created_at DESC LIMIT {jobs}
), done AS (
    SELECT s.seconds
           / ((t.x1 - t.x0) * (t.y1 - t.y0) * greatest(r.spp - a.resumed_from, 1))::float8 AS cost
    FROM recent r
    JOIN attempts a ON a.job_id = r.job_id AND a.kind = 'tile' AND a.outcome = 'done'
    JOIN tiles t ON t.job_id = a.job_id AND t.tile_index = a.tile_index
    CROSS JOIN LATERAL (SELECT coalesce(a.render_seconds,
                                        extract(epoch FROM a.ended_at - a.started_at)::float8)
                        AS seconds) s
    WHERE s.seconds >= {min_seconds}
    ORDER BY a.ended_at DESC LIMIT {sample}
)
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY cost) AS cost, count(*) AS n FROM done
"""


@dataclass(frozen=True)
class CostEstimate:
    """Seconds per pixel-sample, over ``attempts`` finished tiles; ``scope``: ``scene`` (the same
    cost key) or ``renderer`` (any scene of the renderer)."""

    seconds_per_sample: float
    attempts: int
    scope: str


async def tile_cost(
    conn: Conn, job_id: str, cost_key: str | None, renderer: str
) -> CostEstimate | None:
    """The measured cost for ``job_id``'s tiles (its own attempts left out), or ``None``."""
    scopes: list[tuple[str, str, str]] = []
    if cost_key is not None:
        scopes.append(("scene", "j.cost_key = $1", cost_key))
    scopes.append(("renderer", "j.renderer = $1", renderer))
    for scope, where, value in scopes:
        sql = _COST_SQL.format(
            where=where, jobs=COST_JOBS, sample=COST_SAMPLE, min_seconds=COST_MIN_SECONDS
        )
        row = await conn.fetchrow(sql, value, job_id)
        if row is not None and row["n"] >= COST_MIN_ATTEMPTS and (row["cost"] or 0) > 0:
            return CostEstimate(float(row["cost"]), int(row["n"]), scope)
    return None
