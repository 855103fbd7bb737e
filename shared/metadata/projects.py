"""Projects: an operator's weights and caps (audited), and what each project is using.

A project exists as soon as a job names it; a ``projects`` row only records settings other than
the defaults (weight 1, no cap on in-flight tiles). Every change writes a ``project_events`` row
with its actor in the same transaction.

The *share* of a project is its kernel core-seconds within the share window over everyone's:
a tile attempt holds one kernel thread from its start to its end, so its core-seconds are the
part of ``[started_at, ended_at or now]`` inside the window. :data:`USAGE_SQL` is the one
query that measures it (``project list``/``show``, ``tessera top``, the scheduler's gauges).
"""

from __future__ import annotations

import math

from shared.core.errors import NotFoundError, ValidationError
from shared.core.lifecycle import TERMINAL_JOB_STATES, TileState
from shared.metadata.audit import Conn
from shared.metadata.models import Project, ProjectView

__all__ = ["DEFAULT_WEIGHT", "USAGE_SQL", "check_settings", "project_views", "upsert"]

DEFAULT_WEIGHT = 1.0
_TERMINAL = [s.value for s in TERMINAL_JOB_STATES]
_QUEUED = [TileState.QUEUED.value, TileState.FAILED_RETRYABLE.value]
_IN_FLIGHT = [TileState.LEASED.value, TileState.PROGRESSING.value]

USAGE_SQL = """
WITH since AS (SELECT now() - make_interval(secs => $1) AS t),
used AS (
    SELECT j.project,
           sum(EXTRACT(EPOCH FROM COALESCE(a.ended_at, now()) - GREATEST(a.started_at, s.t)))
             AS secs
    FROM attempts a JOIN jobs j ON j.job_id = a.job_id, since s
    WHERE a.kind = 'tile' AND (a.ended_at IS NULL OR a.ended_at > s.t)
    GROUP BY j.project
),
tiles_now AS (
    SELECT j.project,
           count(*) FILTER (WHERE t.state = ANY($3::text[])) AS queued,
           count(*) FILTER (WHERE t.state = ANY($4::text[])) AS in_flight
    FROM jobs j LEFT JOIN tiles t ON t.job_id = j.job_id
    WHERE j.state <> ALL($2::text[])
    GROUP BY j.project
),
names AS (
    SELECT name FROM projects UNION SELECT project FROM used UNION SELECT project FROM tiles_now
)
SELECT n.name, p.name IS NOT NULL AS configured, p.weight, p.max_in_flight,
       COALESCE(tn.queued, 0) AS queued, COALESCE(tn.in_flight, 0) AS in_flight,
       COALESCE(u.secs, 0)::double precision AS core_seconds,
       COALESCE(u.secs / NULLIF((SELECT sum(secs) FROM used), 0), 0)::double precision AS share
FROM names n
LEFT JOIN projects p ON p.name = n.name
LEFT JOIN used u ON u.project = n.name
LEFT JOIN tiles_now tn ON tn.project = n.name
WHERE $5::text IS NULL OR n.name = $5
ORDER BY n.name
LIMIT $6
"""
"""Every project (or the one named ``$5``) with its settings, tiles and share over ``$1`` s."""


def check_settings(weight: float, max_in_flight: int | None) -> None:
    """ValidationError unless ``weight`` is finite and > 0 and the cap is None or >= 1."""
    if not (isinstance(weight, int | float) and math.isfinite(weight) and weight > 0):
        raise ValidationError(f"weight: {weight!r} must be a finite number > 0")
    if max_in_flight is not None and max_in_flight < 1:
        raise ValidationError(f"max_in_flight: {max_in_flight} must be at least 1 (or none)")


async def upsert(
    conn: Conn, name: str, *, weight: float, max_in_flight: int | None, actor: str
) -> Project:
    """Set the project's weight and cap, audited with ``actor``; the row."""
    check_settings(weight, max_in_flight)
    row = await conn.fetchrow(
        """
        INSERT INTO projects (name, weight, max_in_flight) VALUES ($1, $2, $3)
        ON CONFLICT (name) DO UPDATE
            SET weight = EXCLUDED.weight, max_in_flight = EXCLUDED.max_in_flight,
                updated_at = now()
        RETURNING *
        """,
        name,
        float(weight),
        max_in_flight,
    )
    await conn.execute(
        """
        INSERT INTO project_events (project, weight, max_in_flight, actor)
        VALUES ($1, $2, $3, $4)
        """,
        name,
        float(weight),
        max_in_flight,
        actor,
    )
    assert row is not None  # an upsert always returns its row
    return Project.from_record(row)


async def project_views(
    conn: Conn, *, window: float, name: str | None = None, limit: int = 1000
) -> list[ProjectView]:
    """Known projects by name, at most ``limit`` (or only ``name``: NotFoundError if no
    settings, live job or recent work names it)."""
    rows = await conn.fetch(USAGE_SQL, window, _TERMINAL, _QUEUED, _IN_FLIGHT, name, limit)
    if name is not None and not rows:
        raise NotFoundError(f"project {name} does not exist (no settings and no jobs)")
    return [
        ProjectView(
            name=r["name"],
            configured=bool(r["configured"]),
            weight=DEFAULT_WEIGHT if r["weight"] is None else float(r["weight"]),
            max_in_flight=r["max_in_flight"],
            queued=int(r["queued"]),
            in_flight=int(r["in_flight"]),
            core_seconds=float(r["core_seconds"]),
            share=float(r["share"]),
        )
        for r in rows
    ]
