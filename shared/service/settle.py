"""Settling a delivery: every handler's outcome becomes one JetStream action, here and only here.

A handler returns (or maps its exception to) a typed outcome, and :func:`settle` applies it to
the :class:`Delivery`, which wraps the nats-py message and translates its errors::

    outcome                        JetStream action
    ─────────────────────────────  ─────────────────────────────────────────────────────────
    Ack                            ack_sync, retried within a bound (an ack to a dead leader
                                   is lost otherwise)
    Ack(confirm=False)             ack, not waited for: only where PostgreSQL already records
                                   the work as done, so a lost ack costs one redelivery that
                                   finds it done (ACK_RECORDED)
    Retry(delay)                   nak(delay): the message comes back after ``delay``
    HandBack                       nak() at once: another consumer takes it now (SIGTERM)
    DeadLetter(job, unit, error)   DLQ copy, then the handler's ``record`` of the failure,
                                   then term() (term deletes at once on a work-queue stream)
    Leave(reason)                  nothing: the message belongs to another owner now (lease
                                   lost, fenced); its fate is theirs

    exception (outcome_of)         outcome
    ─────────────────────────────  ─────────────────────────────────────────────────────────
    IllegalTransition              Ack (a race with a cancel or a finished job: nothing to redo)
    LeaseLost                      Leave
    TerminalError (DecodeError…)   DeadLetter
    RetryableError                 Retry(backoff(deliveries))

A message that carries several units (a run of tiles) gets one outcome from its units' own,
:func:`combine`, and is settled once.

Acks and +WPI are keyed by stream sequence, not by delivery (NATS-NOTES), so the broker ack is
never the source of truth; a delivery is settled at most once, and any later settle of it is a
no-op. An exception of no expected type is not an outcome: it propagates, the consume loop logs
it, and the message comes back after ``ack_wait``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import nats.errors
from nats.aio.msg import Msg

from shared.core.errors import LeaseLost, RetryableError, StoreUnavailable, TerminalError
from shared.core.lifecycle import IllegalTransition
from shared.core.retry import RetryPolicy, backoff
from shared.nats.jetstream import ack_sync_retry
from shared.service.deadletter import dead_letter
from shared.service.runtime import Runtime

__all__ = [
    "ACK",
    "ACK_RECORDED",
    "HAND_BACK",
    "Ack",
    "DeadLetter",
    "Delivery",
    "HandBack",
    "Leave",
    "Outcome",
    "Retry",
    "combine",
    "outcome_of",
    "settle",
]


@dataclass(frozen=True)
class Ack:
    """Done with the message (success, or nothing left to do).

    ``confirm``: wait for the server's confirmation of the ack (retried within a bound). Without
    it the ack is sent and not waited for: a round trip less per message, for the paths whose
    result PostgreSQL already holds (a committed tile, a tile-done event whose job is not yet
    complete), where a lost ack only means a redelivery that finds the work done.
    """

    confirm: bool = True


@dataclass(frozen=True)
class Retry:
    """Redeliver after ``delay`` seconds; ``error`` is why (``None``: the unit is busy)."""

    delay: float
    error: RetryableError | None = None


@dataclass(frozen=True)
class HandBack:
    """Give the message back at once, for another consumer (a drain)."""


@dataclass(frozen=True)
class DeadLetter:
    """Never going to succeed: copy to the DLQ under ``unit`` of ``job_id``, then term.

    ``record`` (the handler's bookkeeping of the failure: tile and job failed) runs between the
    copy and the term, so a crash before the term redelivers a message whose copy is already in
    the DLQ (the copy's id is keyed by stream and sequence: a repeat is absorbed).
    """

    job_id: str | None
    unit: str
    error: TerminalError
    record: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True)
class Leave:
    """Settle nothing: another owner holds the message's fate (``reason``: lease_lost, fenced)."""

    reason: str


Outcome = Ack | Retry | HandBack | DeadLetter | Leave

ACK = Ack()
ACK_RECORDED = Ack(confirm=False)
HAND_BACK = HandBack()

#: copies a delivered message to the DLQ (``shared.service.deadletter.dead_letter`` bound to a
#: runtime)
DeadLetterCopy = Callable[[Msg, DeadLetter], Awaitable[None]]


class Delivery:
    """One delivery of a JetStream message, settled at most once.

    nats-py's errors are translated here: a connection that is closed or cannot take the
    request raises :class:`StoreUnavailable`; the bounded ack retry is
    :func:`~shared.nats.jetstream.ack_sync_retry`'s. A second settle of the same delivery (or an
    ``in_progress`` after it) changes nothing.
    """

    def __init__(self, msg: Msg, copy: DeadLetterCopy) -> None:
        self.msg = msg
        self._copy = copy
        #: how the delivery was settled (``ack``, ``nak``, ``term``), or ``None``
        self.settled: str | None = None
        #: when its ack deadline was last reset (monotonic), or ``None``
        self.extended_at: float | None = None

    @classmethod
    def of(cls, rt: Runtime, msg: Msg) -> Delivery:
        """A delivery whose dead letters go to ``rt``'s DLQ stream."""

        async def copy(original: Msg, letter: DeadLetter) -> None:
            await dead_letter(rt, original, job_id=letter.job_id, unit=letter.unit,
                              error=letter.error)  # fmt: skip

        return cls(msg, copy)

    @property
    def data(self) -> bytes:
        """The message body."""
        return self.msg.data

    @property
    def subject(self) -> str:
        """The subject the message was published on."""
        return self.msg.subject

    @property
    def deliveries(self) -> int:
        """How many times the message was delivered, this delivery included."""
        return int(self.msg.metadata.num_delivered)

    async def ack(self, *, confirm: bool = True) -> None:
        """Acknowledge and wait for the server's confirmation (retried within a bound);
        ``confirm=False``: send the ack and do not wait (see :class:`Ack`)."""
        if self.settled is None:
            if confirm:
                await ack_sync_retry(self.msg)
            else:
                await self._send("ack", self.msg.ack())
            self.settled = "ack"

    async def nak(self, delay: float | None = None) -> None:
        """Ask for a redelivery after ``delay`` seconds (at once when ``None``)."""
        if self.settled is None:
            await self._send("nak", self.msg.nak(delay=delay))
            self.settled = "nak"

    async def term(self, letter: DeadLetter) -> None:
        """Copy to the DLQ, run the letter's ``record``, then terminate the message."""
        if self.settled is not None:
            return
        await self._copy(self.msg, letter)
        if letter.record is not None:
            await letter.record()
        await self._send("term", self.msg.term())
        self.settled = "term"

    async def in_progress(self, *, unless_within: float = 0.0) -> None:
        """Reset the ack deadline (+WPI); nothing once the delivery is settled, nor when this
        delivery's deadline was reset less than ``unless_within`` seconds ago (the tiles of a
        run share one message: their heartbeats, due together, need to reset it once)."""
        if self.settled is not None:
            return
        now = time.monotonic()
        if self.extended_at is not None and now - self.extended_at < unless_within:
            return
        self.extended_at = now
        await self._extend()

    async def _extend(self) -> None:
        await self._send("in_progress", self.msg.in_progress())

    async def _send(self, what: str, request: Awaitable[None]) -> None:
        try:
            await request
        except nats.errors.MsgAlreadyAckdError:
            return  # settled by this client already: the first settle stands
        except nats.errors.Error as exc:
            raise StoreUnavailable(f"{what} of {self.msg.subject}: {exc!r}") from exc


async def settle(delivery: Delivery, outcome: Outcome) -> None:
    """Apply ``outcome`` to ``delivery`` (the one place an outcome becomes an action)."""
    match outcome:
        case Ack(confirm=confirm):
            await delivery.ack(confirm=confirm)
        case Retry(delay=delay):
            await delivery.nak(delay)
        case HandBack():
            await delivery.nak()
        case DeadLetter():
            await delivery.term(outcome)
        case Leave():
            pass


def combine(outcomes: Sequence[Outcome]) -> Outcome:
    """The one outcome of a message that carried several units (a run of tiles), from each
    unit's own, strongest first:

    - a :class:`DeadLetter` (the first; its ``record`` runs every dead letter's): the job fails
      for good whatever the other tiles did, so the message is copied and terminated;
    - a :class:`Leave` (the first): another owner holds a tile under a copy of this message,
      whose fate is theirs — settling it here would settle their copy too;
    - a :class:`Retry`, with the longest delay: every tile waits at least its own backoff (a
      done tile of the run is found done on the redelivery);
    - :data:`HAND_BACK`: the drain gives the message back at once;
    - an :class:`Ack`, confirmed if any unit asked for a confirmed one.
    """
    letters = [o for o in outcomes if isinstance(o, DeadLetter)]
    if letters:
        records = [letter.record for letter in letters if letter.record is not None]
        if len(records) <= 1:
            return replace(letters[0], record=records[0] if records else None)

        async def record_all() -> None:
            for record in records:
                await record()

        return replace(letters[0], record=record_all)
    for o in outcomes:
        if isinstance(o, Leave):
            return o
    retries = [o for o in outcomes if isinstance(o, Retry)]
    if retries:
        return max(retries, key=lambda r: r.delay)
    if any(isinstance(o, HandBack) for o in outcomes):
        return HAND_BACK
    return ACK if any(isinstance(o, Ack) and o.confirm for o in outcomes) else ACK_RECORDED


def outcome_of(
    exc: RetryableError | TerminalError,
    *,
    retry: RetryPolicy,
    deliveries: int,
    job_id: str | None,
    unit: str,
) -> Outcome:
    """The outcome of a handler that raised ``exc`` (see the table in the module docstring).

    ``job_id`` and ``unit`` name the dead letter of a terminal error; the delay of a retryable
    one is ``backoff(retry, deliveries)``.
    """
    if isinstance(exc, IllegalTransition):
        return ACK
    if isinstance(exc, LeaseLost):
        return Leave(exc.code)
    if isinstance(exc, TerminalError):
        return DeadLetter(job_id, unit, exc)
    return Retry(backoff(retry, deliveries), exc)
