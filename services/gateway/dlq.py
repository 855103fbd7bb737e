"""The dead-letter verbs: list, show, requeue and purge the ``DLQ`` stream.

Dead letters are read straight from the stream by sequence (``get_msg`` with ``next_by_subj``),
so listing needs no consumer and leaves nothing behind; the cursor of a page is the last
sequence it showed.

``dlq.requeue`` walks the matching letters oldest first and hands each to
:class:`shared.service.requeue.Requeuer`, which moves the tile (and its job) out of
``dead_lettered`` in the metadata store — otherwise the republished message would be acked
unprocessed by the first worker that sees the terminal job — republishes under a new generation,
and only then deletes the letter. Requeues are paced at ``rate`` per second
(:class:`shared.service.pacing.Pacer`), so a replay cannot start a retry storm; the reply comes
when all are done, so a client waits about ``count / rate`` seconds. ``dry_run`` only plans:
it writes nothing and reports, per letter, what would happen and why.

Replies stay below NATS's ``max_payload`` (:data:`proto.limits.MAX_REPLY_BYTES`): a ``list``
page ends early, with ``next_cursor`` where it stopped; a requeue report lists the leading
letters and counts the rest in ``omitted`` (``requeued``, ``skipped`` and ``examined`` always
count them all). Errors are cut to :data:`proto.limits.MAX_VIEW_ERROR` characters except in
``show``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import orjson
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError as JsNotFound

from proto.api import (
    DlqListRequest,
    DlqPurgeRequest,
    DlqRequeueRequest,
    DlqShowRequest,
    decode_request,
)
from proto.api_replies import (
    DeadLetterDetail,
    DeadLetterView,
    DlqListReply,
    DlqPurgeReply,
    DlqRequeueReply,
    DlqShowReply,
    RequeueView,
    reply_fields,
)
from proto.limits import MAX_REPLY_BYTES, MAX_VIEW_ERROR
from proto.messages import DeadLetter
from proto.names import DLQ_UNIT_JOB, STREAM_DLQ, Names
from services.gateway.views import iso, within_budget
from shared.core.errors import DecodeError, NotFoundError, TerminalError, ValidationError
from shared.nats.jetstream import retry_transient
from shared.service.logs import Log
from shared.service.pacing import Pacer
from shared.service.requeue import SKIP, Plan, Requeuer

__all__ = ["DlqHandlers", "dead_letter_detail", "dead_letter_view"]

Headers = Mapping[str, str] | None
READ_TIMEOUT = 5.0


def dead_letter_view(raw: api.RawStreamMsg) -> DeadLetterView:
    """A dead letter as it appears in ``dlq.list`` (its error cut short)."""
    return DeadLetterView(**_view_fields(raw, whole=False)[0])


def dead_letter_detail(raw: api.RawStreamMsg) -> DeadLetterDetail:
    """A dead letter as ``dlq.show`` has it: the whole error and the original bytes (base64)."""
    fields, letter = _view_fields(raw, whole=True)
    payload = None if letter is None else base64.b64encode(letter.payload).decode()
    return DeadLetterDetail(**fields, payload_b64=payload)


def _view_fields(raw: api.RawStreamMsg, *, whole: bool) -> tuple[dict[str, Any], DeadLetter | None]:
    where = {"seq": raw.seq or 0, "subject": raw.subject or "", "time": iso(raw.time)}
    try:
        letter = DeadLetter.decode(raw.data or b"")
    except DecodeError as exc:  # a foreign message in our stream: show it, do not fail the page
        empty = dict.fromkeys(f for f in reply_fields(DeadLetterView) if f not in where)
        return empty | where | {"malformed": str(exc)}, None
    return where | {
        "malformed": None,
        "job_id": letter.job_id,
        "unit": letter.unit,
        "reason": letter.reason,
        "error": letter.error if whole else _cut(letter.error),
        "source_stream": letter.source_stream,
        "source_seq": letter.source_seq,
        "deliveries": letter.deliveries,
        "original_subject": letter.subject,
    }, letter


class DlqHandlers:
    """``dlq.list``, ``dlq.show``, ``dlq.purge`` and (given a requeuer) ``dlq.requeue``."""

    def __init__(
        self,
        js: JetStreamContext,
        names: Names,
        log: Log,
        *,
        requeuer: Requeuer | None = None,
        reply_budget: int = MAX_REPLY_BYTES,
    ) -> None:
        self.js, self.names, self.log = js, names, log
        self.stream = names.stream(STREAM_DLQ)
        self.requeuer = requeuer
        #: bytes of letter views one reply may carry (below the server's max_payload)
        self.reply_budget = reply_budget

    def _filter(self, job_id: str | None) -> str:
        if job_id is None:
            return self.names.dlq_subjects
        # every unit of a job shares the subject up to its last token: tessera.dlq.<job>.*
        return self.names.dlq_subject(job_id, DLQ_UNIT_JOB).rsplit(".", 1)[0] + ".*"

    async def _next(self, seq: int, subject: str) -> api.RawStreamMsg | None:
        """The first dead letter at or after ``seq`` on ``subject``, or None."""

        async def attempt(budget: float) -> api.RawStreamMsg | None:
            try:
                return await self.js.get_msg(self.stream, seq=seq, subject=subject, next=True)
            except JsNotFound:
                return None

        return await retry_transient("DLQ read", attempt, timeout_total=READ_TIMEOUT)

    async def list(self, data: bytes, headers: Headers) -> DlqListReply:
        """``tessera.api.dlq.list``: dead letters oldest first; ``next_cursor`` null at the end."""
        request = decode_request(data, headers, DlqListRequest)
        seq = _cursor_seq(request.cursor) + 1
        subject, views, used, more = self._filter(request.job_id), list[DeadLetterView](), 0, False
        while True:
            raw = await self._next(seq, subject)
            if raw is None or raw.seq is None:
                break
            view = dead_letter_view(raw)
            used += len(orjson.dumps(view)) + 1
            if len(views) == request.limit or (views and used > self.reply_budget):
                more = True  # a next page exists; it starts with this letter
                break
            views.append(view)
            seq = raw.seq + 1
        return DlqListReply(dead_letters=views, next_cursor=str(views[-1].seq) if more else None)

    async def show(self, data: bytes, headers: Headers) -> DlqShowReply:
        """``tessera.api.dlq.show``: one dead letter, with its original payload."""
        request = decode_request(data, headers, DlqShowRequest)
        raw = await self._next(request.seq, self.names.dlq_subjects)
        if raw is None or raw.seq != request.seq:
            raise NotFoundError(f"dead letter {request.seq} does not exist")
        return DlqShowReply(dead_letter=dead_letter_detail(raw))

    async def requeue(self, data: bytes, headers: Headers) -> DlqRequeueReply:
        """``tessera.api.dlq.requeue``: requeue matching dead letters at ``rate`` per second.

        Replies ``dead_letters`` (each with ``action`` requeue/replay/skip, ``why``, ``done``),
        ``requeued`` (letters acted on) and ``skipped``; ``dry_run`` plans only.
        """
        request = decode_request(data, headers, DlqRequeueRequest)
        if self.requeuer is None:
            raise ValidationError("dlq.requeue is not served by this gateway")
        subject, seq = self._filter(request.job_id), 1
        pacer, plans, missing = Pacer(request.rate), list[Plan](), list[int]()
        chosen = iter(request.seqs) if request.seqs is not None else None
        while len(plans) < request.limit:
            if chosen is not None:  # the letters named, each read at its own sequence
                want = next(chosen, None)
                if want is None:
                    break
                raw = await self._next(want, subject)
                if raw is None or raw.seq != want:
                    missing.append(want)
                    continue
            else:
                raw = await self._next(seq, subject)
                if raw is None or raw.seq is None:
                    break
                seq = raw.seq + 1
            plans.append(await self._requeue_one(raw, request.dry_run, pacer))
        acted = [p for p in plans if p.action != SKIP]
        views = within_budget(
            (RequeueView(**p.view() | {"error": _cut(p.error)}) for p in plans), self.reply_budget
        )
        return DlqRequeueReply(
            dry_run=request.dry_run,
            requeued=len(acted),
            skipped=len(plans) - len(acted),
            examined=len(plans),
            dead_letters=views,
            omitted=len(plans) - len(views),
            missing=missing,
        )

    async def _requeue_one(self, raw: api.RawStreamMsg, dry_run: bool, pacer: Pacer) -> Plan:
        """The plan for one letter, applied (paced) unless ``dry_run`` or a skip."""
        assert self.requeuer is not None
        plan = await self.requeuer.plan(raw)
        if dry_run or plan.action == SKIP:
            return plan
        await pacer.wait()
        try:
            return await self.requeuer.apply(plan)
        except TerminalError as exc:  # a race with another operator or a worker
            return Plan(plan.seq, plan.job_id, plan.unit, plan.reason, plan.error, SKIP,
                        f"{plan.action} refused: {exc}", plan.tile)  # fmt: skip

    async def purge(self, data: bytes, headers: Headers) -> DlqPurgeReply:
        """``tessera.api.dlq.purge``: delete one job's dead letters (or all); ``dry_run`` counts.

        ``purged`` is the count just before the purge (JetStream's own count is not exposed by
        nats-py); letters arriving in between are purged too.
        """
        request = decode_request(data, headers, DlqPurgeRequest)
        subject = self._filter(request.job_id)

        async def count(budget: float) -> int:
            info = await self.js.stream_info(self.stream, subjects_filter=subject)
            return sum((info.state.subjects or {}).values())

        matched = await retry_transient("DLQ count", count, timeout_total=READ_TIMEOUT)
        if not request.dry_run and matched:

            async def purge(budget: float) -> bool:
                return await self.js.purge_stream(self.stream, subject=subject)

            await retry_transient("DLQ purge", purge, timeout_total=READ_TIMEOUT)
            self.log.warning("dead letters purged", job_id=request.job_id, count=matched)
        purged = 0 if request.dry_run else matched
        return DlqPurgeReply(purged=purged, matched=matched, dry_run=request.dry_run)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_VIEW_ERROR else text[: MAX_VIEW_ERROR - 1] + "\u2026"


def _cursor_seq(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.isdigit() or len(cursor) > 19:
        raise ValidationError(f"cursor: {cursor!r:.40} is not a DLQ cursor (a sequence number)")
    return int(cursor)
