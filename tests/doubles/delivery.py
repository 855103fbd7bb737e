"""A delivery without a message, recording how it was settled.

It does what :class:`shared.service.settle.Delivery` does on a real consumer, as
``tests/stores/test_settle.py`` checks there: settled at most once, ``nak`` with or without a
delay, ``term`` after the DLQ copy and then the letter's ``record``, ``in_progress`` a no-op
once settled, ``data`` and ``deliveries`` the message's.
"""

from __future__ import annotations

from shared.service.settle import DeadLetter, Delivery

__all__ = ["FakeDelivery"]


class FakeDelivery(Delivery):
    """A :class:`Delivery` of ``data``, delivered ``deliveries`` times; records its settle."""

    def __init__(
        self, data: bytes, deliveries: int = 1, subject: str = "tessera.tiles.j1.0"
    ) -> None:  # no message: no super()
        self._body, self._count, self._subject = data, deliveries, subject
        self.settled: str | None = None
        self.delay: float | None = None
        self.letters: list[DeadLetter] = []
        self.in_progress_calls = 0
        self.extended_at: float | None = None
        #: whether the ack waited for the server's confirmation (``None``: not acked)
        self.confirmed: bool | None = None

    @property
    def data(self) -> bytes:
        return self._body

    @property
    def subject(self) -> str:
        return self._subject

    @property
    def deliveries(self) -> int:
        return self._count

    async def ack(self, *, confirm: bool = True) -> None:
        if self.settled is None:
            self.settled, self.confirmed = "ack", confirm

    async def nak(self, delay: float | None = None) -> None:
        if self.settled is None:
            self.settled, self.delay = "nak", delay

    async def term(self, letter: DeadLetter) -> None:
        if self.settled is not None:
            return
        self.letters.append(letter)
        if letter.record is not None:
            await letter.record()
        self.settled = "term"

    async def _extend(self) -> None:
        self.in_progress_calls += 1
