"""Job events for watchers: one publish per (job, kind, generation)."""

from __future__ import annotations

from proto import names as n
from proto.messages import JobEvent
from shared.jetstream import publish
from shared.runtime import Runtime

__all__ = ["announce"]


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
