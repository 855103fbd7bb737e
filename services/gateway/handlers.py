"""The job verbs: submit, status, list, cancel, retry.

Each handler takes the raw request (body and headers) and returns its verb's reply schema
(:mod:`proto.api_replies`), or raises a :class:`~shared.core.errors.TesseraError` that
:func:`proto.replies.reply_for_exception` turns into the error reply. Everything that can refuse
a request (decoding, limits, the kernel's scene validation) runs before the first write, so a
refused request writes nothing.

Publishing after a database write is the one gap a crash can open; both writes that need a
message are made replayable instead of atomic. A job is ``queued`` exactly until the scheduler
has planned its current generation (planning and the state change are one transaction), so a
duplicate submit of a ``queued`` job publishes its ``JOBS`` message again, and so does a retry
that finds the job already re-queued at generation > 0: the ``Nats-Msg-Id`` (``job:<id>:<gen>``)
absorbs the copy inside the duplicate window, and the scheduler's planning is idempotent beyond.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from nats.js import JetStreamContext

from proto.api import JobRequest, ListRequest, SubmitRequest, decode_request
from proto.api_replies import CancelReply, ListReply, RetryReply, StatusReply, SubmitReply
from proto.idempotency import (
    SCHEDULING_FIELDS,
    cost_key,
    idempotency_key,
    request_fingerprint,
    scene_hash,
)
from proto.limits import TILE_AUTO
from proto.messages import JobEvent, JobMessage
from proto.names import (
    BUCKET_WORKERS,
    RENDERER_TESSERA,
    EventKind,
    Names,
    event_msg_id,
    job_msg_id,
    new_job_id,
)
from services.gateway.intake import Intake
from services.gateway.scenes import check_submission, check_submission_sync
from services.gateway.views import job_status, job_summary
from shared.core.errors import NotFoundError
from shared.core.lifecycle import IllegalTransition, JobState, is_terminal
from shared.metadata import MetadataStore
from shared.metadata.jobs import MAX_LIST
from shared.metadata.models import Job, NewJob
from shared.nats.jetstream import publish
from shared.nats.presence import LiveRenderers, LiveWorkers
from shared.service.logs import Log
from shared.service.metrics import Metrics

__all__ = ["Handlers", "new_job_for", "prepare_submission"]

Headers = Mapping[str, str] | None


def new_job_for(request: SubmitRequest, scene: dict[str, Any], input_hash: str) -> NewJob:
    """The row a validated submission inserts (a fresh job id; the key decides if it is used)."""
    body = request.to_body()
    for field in ("idempotency_key", *SCHEDULING_FIELDS):
        body.pop(field, None)
    body["scene"] = scene_hash(request.scene)
    auto = request.tile_size == TILE_AUTO
    return NewJob(
        job_id=new_job_id(),
        idempotency_key=idempotency_key(request),
        fingerprint=request_fingerprint(request),
        project=request.project,
        request=body,
        scene=scene,
        frame=request.frame,
        input_hash=input_hash,
        width=request.width,
        height=request.height,
        spp=request.spp,
        tile_size=0 if request.tile_size == TILE_AUTO else request.tile_size,
        tile_auto=auto,
        cost_key=cost_key(request),
        renderer=request.renderer,
        priority=request.priority,
        deadline_at=request.deadline_at(),
    )


def prepare_submission(data: bytes, headers: Headers) -> NewJob:
    """Decode, validate and hash a submit body: its row, or DecodeError/ValidationError.

    Pure CPU work, no I/O: the gateway runs it in a worker process for a large body.
    """
    request = decode_request(data, headers, SubmitRequest)
    checked = check_submission_sync(request)
    return new_job_for(request, checked.doc, checked.input_hash)


class Handlers:
    """The job verbs over one metadata store and one JetStream context."""

    def __init__(
        self,
        db: MetadataStore,
        js: JetStreamContext,
        names: Names,
        log: Log,
        metrics: Metrics | None = None,
        intake: Intake | None = None,
        check_reference: Callable[[Mapping[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.db, self.js, self.names, self.log = db, js, names, log
        #: a Blender or POV-Ray job's asset is stored and has its main file (NotFound/Invalid)
        self.check_reference = check_reference
        self.metrics = metrics or Metrics()
        #: where a large submit body (an inline scene) is decoded and checked
        self.intake = intake or Intake()
        #: submits answered with an existing job (the same logical request seen again)
        self.duplicate_submits = 0
        #: which renderers live workers run (the live-workers bucket, read at most every 2 s)
        self.renderers = LiveRenderers(LiveWorkers(js, names.bucket(BUCKET_WORKERS)))

    async def submit(self, data: bytes, headers: Headers) -> SubmitReply:
        """``tessera.api.submit``: create the job once per idempotency key and queue it."""
        if (
            len(data) >= self.intake.large_body_bytes
        ):  # canonical JSON and hashing of a big scene: CPU
            new_job = await self.intake.offload(prepare_submission, data, headers)
        else:
            request = decode_request(data, headers, SubmitRequest)
            checked = await check_submission(request)
            new_job = new_job_for(request, checked.doc, checked.input_hash)
        if new_job.renderer != RENDERER_TESSERA and self.check_reference is not None:
            await self.check_reference(new_job.scene)
        result = await self.db.submit_job(new_job)
        job = result.job
        if not result.created:
            self.duplicate_submits += 1
            self.metrics.duplicates.labels(source="idempotency_key").inc()
        if result.created or job.state is JobState.QUEUED:
            await self._publish_job(job)
        log = self.log.bind(job_id=job.job_id, idempotency_key=job.idempotency_key)
        log.info("job submitted" if result.created else "duplicate submit", state=job.state.value)
        return SubmitReply(
            job_id=job.job_id,
            created=result.created,
            duplicate=not result.created,
            state=job.state.value,
            idempotency_key=job.idempotency_key,
            input_hash=job.input_hash,
        )

    async def _publish_job(self, job: Job) -> None:
        message = JobMessage(job.job_id, generation=job.generation)
        subject = self.names.job_subject(job.job_id)
        msg_id = job_msg_id(job.job_id, job.generation)
        self.metrics.published(await publish(self.js, subject, message, msg_id=msg_id))

    async def _publish_event(self, job: Job, kind: EventKind, detail: str) -> None:
        event = JobEvent(job.job_id, kind, generation=job.generation, detail=detail)
        subject = self.names.event_subject(job.job_id, kind)
        msg_id = event_msg_id(job.job_id, kind, job.generation)
        self.metrics.published(await publish(self.js, subject, event, msg_id=msg_id))

    async def _job(self, job_id: str) -> Job:
        job = await self.db.get_job(job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} does not exist")
        return job

    async def status(self, data: bytes, headers: Headers) -> StatusReply:
        """``tessera.api.status``: state, progress, result and last error of one job."""
        request = decode_request(data, headers, JobRequest)
        job = await self._job(request.job_id)
        counts = await self.db.tile_counts(job.job_id)
        waiting = None
        if not is_terminal(job.state) and counts.done < (counts.total or 1):
            waiting = await self.renderers.waiting(job.renderer)
        return job_status(job, counts, waiting)

    async def list(self, data: bytes, headers: Headers) -> ListReply:
        """``tessera.api.list``: a page of jobs, newest first; ``next_cursor`` null at the end."""
        request = decode_request(data, headers, ListRequest)
        # one extra row tells whether a next page exists (the store caps a read at MAX_LIST)
        fetch = min(request.limit + 1, MAX_LIST)
        jobs = await self.db.list_jobs(state=request.state, limit=fetch, before=request.cursor)
        page = jobs[: request.limit]
        more = len(jobs) > request.limit or len(jobs) == fetch == request.limit
        return ListReply(
            jobs=[job_summary(job) for job in page],
            next_cursor=page[-1].job_id if more else None,
        )

    async def cancel(self, data: bytes, headers: Headers) -> CancelReply:
        """``tessera.api.cancel``: flag the job; workers stop at their next pass."""
        request = decode_request(data, headers, JobRequest)
        job = await self.db.request_cancel(request.job_id)
        await self._publish_event(job, EventKind.JOB_CANCELLED, "cancel requested")
        self.log.info("cancel requested", job_id=job.job_id, state=job.state.value)
        return CancelReply(job_id=job.job_id, state=job.state.value, cancel_requested=True)

    async def retry(self, data: bytes, headers: Headers) -> RetryReply:
        """``tessera.api.retry``: re-queue a failed or dead-lettered job as a new generation."""
        request = decode_request(data, headers, JobRequest)
        try:
            job, replayed = await self.db.retry_job(request.job_id), False
        except IllegalTransition:
            job = await self._job(request.job_id)
            if job.generation == 0 or job.state is not JobState.QUEUED:
                raise
            replayed = True  # a retry whose publish was lost: publish it again
        await self._publish_job(job)
        await self._publish_event(job, EventKind.JOB_RETRIED, f"generation {job.generation}")
        self.log.info("job retried", job_id=job.job_id, generation=job.generation)
        return RetryReply(
            job_id=job.job_id, state=job.state.value, generation=job.generation, replayed=replayed
        )
