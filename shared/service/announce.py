"""Job events for watchers: one publish per (job, kind, generation); failing a job says so; a
job's completion (tiles-done) for the finalizer: one publish per completion."""

from __future__ import annotations

from proto import names as n
from proto.messages import JobEvent, TilesDone
from shared.core.lifecycle import IllegalTransition, JobTrigger
from shared.metadata import Job
from shared.nats.jetstream import publish
from shared.service.logs import Log
from shared.service.runtime import Runtime

__all__ = ["announce", "announce_completion", "fail_job"]

_EVENT_FOR = {
    JobTrigger.TERMINAL_FAILURE: n.EventKind.JOB_FAILED,
    JobTrigger.DEAD_LETTER: n.EventKind.JOB_DEAD_LETTERED,
}


async def announce(rt: Runtime, event: JobEvent) -> None:
    """Publish ``event`` on ``tessera.events.<job>.<kind>``; a repeat of the same kind in the
    same job generation (a redelivery after a crash) is absorbed by its ``Nats-Msg-Id``."""
    ack = await publish(
        rt.js,
        rt.names.event_subject(event.job_id, event.kind),
        event,
        msg_id=n.event_msg_id(event.job_id, event.kind, event.generation),
    )
    rt.metrics.published(ack)


async def announce_completion(
    rt: Runtime, job_id: str, completion: int, *, id_suffix: str = ""
) -> None:
    """Publish ``TilesDone(job_id, completion)`` under ``alldone:<job>:<completion>`` plus
    ``id_suffix`` (the planner's ``:gen<g>``, the sweeper's ``:swept<time>``); a repeat of the
    same completion is absorbed by that id."""
    ack = await publish(
        rt.js,
        rt.names.event_subject(job_id, n.EventKind.TILES_DONE),
        TilesDone(job_id, completion),
        msg_id=n.alldone_msg_id(job_id, completion) + id_suffix,
    )
    rt.metrics.published(ack)


async def fail_job(
    rt: Runtime, job_id: str, trigger: JobTrigger, *, code: str, error: str, log: Log
) -> Job | None:
    """Fail the job by ``trigger`` (``terminal_failure`` or ``dead_letter``) and tell watchers.

    The one routine for it (worker, finalizer, dead-lettering). ``None``, and nothing said,
    when the job's state no longer allows the move (it completed, was cancelled or failed
    meanwhile).
    """
    try:
        job = await rt.db.transition_job(
            job_id, trigger, node=rt.node, error_code=code, error=error
        )
    except IllegalTransition:
        return None
    log.warning("job failed", job_id=job_id, to=job.state.value, code=code)
    await announce(rt, JobEvent(job_id, _EVENT_FOR[trigger], job.generation, error[:4000]))
    return job
