"""Which waiting tiles one dispatch round releases: a pure function, no I/O.

The order (docs/architecture.md, "Dispatch"):

1. the highest job **priority** first: a lower priority gets only what the higher ones cannot
   use (no waiting tile, or every project of theirs at its ``max_in_flight``);
2. within a priority, **weighted fair share** between projects: the next tile goes to the
   project with the smallest ``usage / weight``, where ``usage`` is its kernel core-seconds over
   the sliding window plus an ``estimate`` for each tile it has released but not started and
   for each tile this round gives it, so one round splits by weight too;
3. within a project, the **oldest job** first (``created_at``, then ``job_id``), its tiles in
   index order (the SQL takes the lowest indexes).

``budgets`` bounds each renderer's window in **messages**: a job's tiles go ``run`` to a TILES
message (docs/architecture.md, "Runs of short tiles"), so the first tile of each message picked
for a job takes one of its renderer's budget and the next ``run - 1`` ride along; a project's
``max_in_flight`` bounds its released-and-unfinished tiles.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

__all__ = ["ProjectShare", "Waiting", "plan_release"]


@dataclass(frozen=True)
class Waiting:
    """A dispatchable job with ``tiles`` unreleased queued tiles (capped by the caller)."""

    job_id: str
    project: str
    priority: int
    created_at: datetime
    renderer: str
    tiles: int
    #: tiles per message (the window counts messages)
    run: int = 1


@dataclass(frozen=True)
class ProjectShare:
    """A project's standing: operator settings and what it holds now."""

    weight: float = 1.0
    max_in_flight: int | None = None
    #: released and not finished
    in_flight: int = 0
    #: kernel core-seconds over the window, with released-but-unstarted tiles estimated
    usage: float = 0.0


def plan_release(
    waiting: Sequence[Waiting],
    budgets: Mapping[str, int],
    projects: Mapping[str, ProjectShare],
    estimate: float,
    *,
    limit: int | None = None,
) -> dict[str, int]:
    """``job_id -> tiles to release`` (jobs with none left out), ``limit`` tiles at most."""
    left = {r: max(0, b) for r, b in budgets.items()}
    most = max((w.run for w in waiting), default=1)
    total = sum(left.values()) * most if limit is None else limit
    usage = {p: s.usage for p, s in projects.items()}
    held = {p: s.in_flight for p, s in projects.items()}
    picks: dict[str, int] = {}
    for priority in sorted({w.priority for w in waiting}, reverse=True):
        level = sorted(
            (w for w in waiting if w.priority == priority), key=lambda w: (w.created_at, w.job_id)
        )
        queues: dict[str, deque[_Slot]] = {}
        for w in level:
            queues.setdefault(w.project, deque()).append(_Slot(w, w.tiles))
        while total > 0:
            ready = [
                p for p, q in queues.items() if _front(q, left, picks) and _room(p, projects, held)
            ]
            if not ready:
                break
            share = {p: projects.get(p, ProjectShare()) for p in ready}
            project = min(ready, key=lambda p: (usage.get(p, 0.0) / share[p].weight, p))
            slot = queues[project][0]
            job = slot.job
            slot.remaining -= 1
            if _starts_message(job, picks):
                left[job.renderer] -= 1
            picks[job.job_id] = picks.get(job.job_id, 0) + 1
            usage[project] = usage.get(project, 0.0) + estimate
            held[project] = held.get(project, 0) + 1
            total -= 1
    return picks


@dataclass
class _Slot:
    job: Waiting
    remaining: int


def _starts_message(job: Waiting, picks: Mapping[str, int]) -> bool:
    """Whether the next tile picked for ``job`` is the first of a new message."""
    return picks.get(job.job_id, 0) % max(1, job.run) == 0


def _front(queue: deque[_Slot], left: Mapping[str, int], picks: Mapping[str, int]) -> bool:
    """Drop the jobs at the front that can take no more tiles; True if one is left."""
    while queue:
        slot = queue[0]
        fits = left.get(slot.job.renderer, 0) > 0 or not _starts_message(slot.job, picks)
        if slot.remaining > 0 and fits:
            return True
        queue.popleft()
    return False


def _room(project: str, projects: Mapping[str, ProjectShare], held: Mapping[str, int]) -> bool:
    cap = projects.get(project, ProjectShare()).max_in_flight
    return cap is None or held.get(project, 0) < cap
