"""Copy a message that will never succeed to the DLQ stream, with its reason.

The copy's ``Nats-Msg-Id`` is keyed by the original stream and sequence, so a copy repeated after
a crash is absorbed. Callers copy **before** ``term()`` or ``delete_msg`` (on a work-queue stream
both delete the original at once).
"""

from __future__ import annotations

from nats.aio.msg import Msg

from proto import names as n
from proto.messages import DeadLetter
from shared.core.errors import TesseraError, with_detail
from shared.nats.jetstream import publish
from shared.service.runtime import Runtime

__all__ = ["dead_letter", "dead_letter_raw"]

UNKNOWN_JOB = "unknown"
#: characters of a letter's error kept: a message (4000) and a detail (a 4 KiB stderr tail)
MAX_ERROR = 8192


async def dead_letter(
    rt: Runtime, msg: Msg, *, job_id: str | None, unit: str, error: TesseraError
) -> None:
    """Copy a delivered message to the DLQ with ``error``'s code, message and detail (a
    renderer's stderr tail)."""
    meta = msg.metadata
    await dead_letter_raw(
        rt,
        job_id=job_id,
        unit=unit,
        reason=error.code,
        error=with_detail(error),
        stream=meta.stream,
        seq=meta.sequence.stream,
        deliveries=meta.num_delivered,
        subject=msg.subject,
        payload=msg.data,
    )


async def dead_letter_raw(
    rt: Runtime,
    *,
    job_id: str | None,
    unit: str,
    reason: str,
    error: str,
    stream: str,
    seq: int,
    deliveries: int,
    subject: str,
    payload: bytes,
) -> None:
    """Publish one ``DeadLetter`` built from its parts."""
    job = job_id if job_id and n.TOKEN_RE.fullmatch(job_id) else UNKNOWN_JOB
    letter = DeadLetter(
        job_id=job,
        unit=unit,
        reason=reason[:64],
        error=error[:MAX_ERROR],
        source_stream=stream,
        source_seq=seq,
        deliveries=deliveries,
        subject=subject,
        payload=payload,
    )
    ack = await publish(
        rt.js,
        rt.names.dlq_subject(job, unit),
        letter,
        msg_id=n.dlq_msg_id(stream, seq),
    )
    if rt.metrics.published(ack).duplicate:
        return  # a copy repeated after a crash: counted and logged the first time
    rt.metrics.dead_letters.labels(unit=rt.metrics.dead_letter_unit(unit), reason=reason).inc()
    tile = int(unit[5:]) if unit.startswith("tile-") and unit[5:].isdigit() else None
    rt.log.warning("dead-lettered", job_id=job, tile=tile, unit=unit, reason=reason,
                   error=error[:200], seq=seq, deliveries=deliveries)  # fmt: skip
