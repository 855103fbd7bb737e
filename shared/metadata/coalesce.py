"""Group commit: calls made while a batch is in flight share the next round trip.

A worker holds many tiles at once, and with short tiles their runs reach the same step (the
fence, the commit, the completion question) together. Each such call costs PostgreSQL a whole
statement (planning, executor start, locks, a WAL flush) and the worker a pooled round trip,
for one row's worth of work. A :class:`Coalescer` sends the first call at once, alone; calls
that arrive while it is in flight wait for it and then go together in one call of the batch
function, and so on. No timer: under no load a call waits for nothing, under load the batches
grow by themselves with the queue.

What a caller sees does not change: its own answer, or the exception of the batch it was in.
A batch never holds two calls with the same :attr:`key` (the later one waits for the next
batch), so a batch statement can decide each row on its own. A caller that is cancelled while
its call waits is left out of the batch; once the batch is sent, it runs to its end either way
(as a statement already sent to the server would).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

A = TypeVar("A")
R = TypeVar("R")


class Coalescer(Generic[A, R]):
    """Runs ``batch(args) -> answers`` (one answer per argument, in order) for concurrent
    :meth:`call` s, at most ``limit`` calls a batch and one batch at a time."""

    def __init__(
        self,
        batch: Callable[[Sequence[A]], Awaitable[Sequence[R]]],
        *,
        limit: int,
        key: Callable[[A], Hashable] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._batch = batch
        self.limit = limit
        self._key = key
        self._waiting: list[tuple[A, asyncio.Future[R]]] = []
        self._sender: asyncio.Task[None] | None = None
        #: batches sent and calls they carried
        self.batches = 0
        self.calls = 0

    @property
    def waiting(self) -> int:
        """Calls waiting for a batch (not counting the batch in flight)."""
        return sum(1 for _, future in self._waiting if not future.done())

    async def call(self, arg: A) -> R:
        """``arg``'s answer, from the next batch that has room for it."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((arg, future))
        if self._sender is None:
            # A task of its own, so no caller's cancellation ends the batches of the others.
            self._sender = asyncio.create_task(self._send(), name="coalesce")
        return await future

    async def _send(self) -> None:
        try:
            while self._waiting:
                batch = self._next_batch()
                if batch:
                    await self._run(batch)
        except asyncio.CancelledError:  # (the loop is going away): nobody is left waiting
            for _, future in self._waiting:
                future.cancel()
            self._waiting = []
            raise
        finally:
            self._sender = None

    def _next_batch(self) -> list[tuple[A, asyncio.Future[R]]]:
        batch: list[tuple[A, asyncio.Future[R]]] = []
        later: list[tuple[A, asyncio.Future[R]]] = []
        keys: set[Hashable] = set()
        for arg, future in self._waiting:
            if future.done():  # the caller was cancelled before its call was sent
                continue
            key = None if self._key is None else self._key(arg)
            if len(batch) >= self.limit or (key is not None and key in keys):
                later.append((arg, future))
                continue
            keys.add(key)
            batch.append((arg, future))
        self._waiting = later
        return batch

    async def _run(self, batch: list[tuple[A, asyncio.Future[R]]]) -> None:
        self.batches += 1
        self.calls += len(batch)
        try:
            answers = await self._batch([arg for arg, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        if len(answers) != len(batch):
            error = RuntimeError(f"batch answered {len(answers)} of {len(batch)} calls")
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)
