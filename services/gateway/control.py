"""The job-control and project verbs: priority, pause, resume, project set/list/show.

Like :mod:`services.gateway.handlers`, every check that can refuse a request runs before the
first write and a refused request writes nothing: the request schema's limits
(:mod:`proto.api`), then the store's compare-and-set (an illegal move raises
:class:`~shared.core.lifecycle.IllegalTransition` inside the transaction, which then rolls back).

Pause is one transaction (job paused, its idle tiles unreleased), then a ``job-paused`` event:
workers holding its tiles stop at their next pass boundary (they also read the job's state at
every checkpoint, so a lost event only delays the stop to the checkpoint interval). Resume moves
the job back to ``running`` and publishes ``job-resumed``, which wakes the dispatchers: they
release its tiles again (each under a new generation).
"""

from __future__ import annotations

from collections.abc import Mapping

from proto.api import (
    JobRequest,
    PriorityRequest,
    ProjectListRequest,
    ProjectSetRequest,
    ProjectShowRequest,
    decode_request,
)
from proto.api_replies import (
    PauseReply,
    PriorityReply,
    ProjectListReply,
    ProjectSetReply,
    ProjectShowReply,
    ProjectView,
    ResumeReply,
)
from proto.messages import JobEvent
from proto.names import EventKind, event_msg_id
from shared.metadata import Job
from shared.metadata.models import ProjectView as ProjectRow
from shared.nats.jetstream import publish
from shared.service.runtime import Runtime

__all__ = ["ControlHandlers"]

Headers = Mapping[str, str] | None


def project_view(row: ProjectRow) -> ProjectView:
    """The reply form of a project row."""
    return ProjectView(
        name=row.name,
        configured=row.configured,
        weight=row.weight,
        max_in_flight=row.max_in_flight,
        queued=row.queued,
        in_flight=row.in_flight,
        core_seconds=round(row.core_seconds, 3),
        share=round(row.share, 6),
    )


class ControlHandlers:
    """The job-control and project verbs of one gateway (its runtime's stores)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="control")
        self.window = rt.settings.scheduler.fair_share_window

    async def _event(self, job: Job, kind: EventKind, detail: str) -> None:
        # One id per change: a repeat of the same request (no change) is absorbed, a pause
        # after a resume in the same generation is not.
        stamp = int(job.updated_at.timestamp() * 1_000_000)
        msg_id = f"{event_msg_id(job.job_id, kind, job.generation)}:{stamp}"
        event = JobEvent(job.job_id, kind, generation=job.generation, detail=detail)
        subject = self.rt.names.event_subject(job.job_id, kind)
        self.rt.metrics.published(await publish(self.rt.js, subject, event, msg_id=msg_id))

    async def priority(self, data: bytes, headers: Headers) -> PriorityReply:
        """``tessera.api.priority``: set a not-yet-rendered job's priority (audited)."""
        request = decode_request(data, headers, PriorityRequest)
        job = await self.rt.db.set_priority(request.job_id, request.priority, node=self.rt.node)
        self.log.info("priority set", job_id=job.job_id, priority=job.priority)
        return PriorityReply(job_id=job.job_id, state=job.state.value, priority=job.priority)

    async def pause(self, data: bytes, headers: Headers) -> PauseReply:
        """``tessera.api.pause``: pause the job, take its idle tiles back, tell the workers."""
        request = decode_request(data, headers, JobRequest)
        job, moved = await self.rt.db.pause_job(request.job_id, node=self.rt.node)
        await self._event(job, EventKind.JOB_PAUSED, "pause requested")
        self.log.info("job paused", job_id=job.job_id, unreleased=len(moved))
        return PauseReply(job_id=job.job_id, state=job.state.value, tiles_unreleased=len(moved))

    async def resume(self, data: bytes, headers: Headers) -> ResumeReply:
        """``tessera.api.resume``: paused -> running; its tiles become releasable again."""
        request = decode_request(data, headers, JobRequest)
        job = await self.rt.db.resume_job(request.job_id, node=self.rt.node)
        # The job-resumed event also wakes the dispatchers, which release its tiles (they were
        # handed back unreleased; a new generation each, so an old message is dropped).
        await self._event(job, EventKind.JOB_RESUMED, "resumed")
        self.log.info("job resumed", job_id=job.job_id)
        return ResumeReply(job_id=job.job_id, state=job.state.value)

    async def project_set(self, data: bytes, headers: Headers) -> ProjectSetReply:
        """``tessera.api.project.set``: upsert a project's weight and cap, audited."""
        request = decode_request(data, headers, ProjectSetRequest)
        actor = request.actor or f"gateway:{self.rt.node}"
        row = await self.rt.db.set_project(
            request.name, weight=request.weight, max_in_flight=request.max_in_flight, actor=actor
        )
        self.log.info("project set", project=row.name, weight=row.weight, actor=actor)
        return ProjectSetReply(
            name=row.name, weight=row.weight, max_in_flight=row.max_in_flight, actor=actor
        )

    async def project_list(self, data: bytes, headers: Headers) -> ProjectListReply:
        """``tessera.api.project.list``: every project with its tiles and share."""
        request = decode_request(data, headers, ProjectListRequest)
        rows = await self.rt.db.projects(window=self.window, limit=request.limit)
        return ProjectListReply(
            projects=[project_view(r) for r in rows], window_seconds=self.window
        )

    async def project_show(self, data: bytes, headers: Headers) -> ProjectShowReply:
        """``tessera.api.project.show``: one project (not_found if no row or job names it)."""
        request = decode_request(data, headers, ProjectShowRequest)
        rows = await self.rt.db.projects(window=self.window, name=request.name)
        return ProjectShowReply(project=project_view(rows[0]), window_seconds=self.window)
