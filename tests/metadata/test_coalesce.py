"""The group commit's batching (:class:`shared.metadata.coalesce.Coalescer`), on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from shared.metadata.coalesce import Coalescer

BOUND = 5.0


class Gate:
    """A batch function that records each batch and holds it until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, args: Sequence[int]) -> list[int]:
        self.batches.append(list(args))
        self.entered.set()
        await self.release.wait()
        return [a * 10 for a in args]


async def _hold_first_batch(gate: Gate, coalescer: Coalescer[int, int]) -> asyncio.Task[int]:
    """Start one call and wait (bounded) until its batch is in flight, held by ``gate``."""
    gate.release.clear()
    first = asyncio.create_task(coalescer.call(0))
    await asyncio.wait_for(gate.entered.wait(), BOUND)
    return first


async def _until_waiting(coalescer: Coalescer[int, int], count: int) -> None:
    """Yield to the loop (a bounded number of times) until ``count`` calls wait for a batch."""
    for _ in range(1000):
        if coalescer.waiting == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{coalescer.waiting} calls wait, not {count}")


async def test_a_lone_call_goes_at_once_and_alone() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, limit=8)
    assert await asyncio.wait_for(coalescer.call(3), BOUND) == 30
    assert gate.batches == [[3]]
    assert (coalescer.batches, coalescer.calls) == (1, 1)


async def test_calls_made_while_a_batch_is_in_flight_share_the_next() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, limit=8)
    first = await _hold_first_batch(gate, coalescer)
    rest = [asyncio.create_task(coalescer.call(i)) for i in range(1, 6)]
    await _until_waiting(coalescer, 5)
    assert gate.batches == [[0]], "nothing more is sent while a batch is in flight"
    gate.release.set()
    answers = await asyncio.wait_for(asyncio.gather(first, *rest), BOUND)
    assert answers == [0, 10, 20, 30, 40, 50]
    assert gate.batches == [[0], [1, 2, 3, 4, 5]]


async def test_a_batch_holds_at_most_limit_calls() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, limit=2)
    first = await _hold_first_batch(gate, coalescer)
    rest = [asyncio.create_task(coalescer.call(i)) for i in range(1, 6)]
    await _until_waiting(coalescer, 5)
    gate.release.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), BOUND)
    assert gate.batches == [[0], [1, 2], [3, 4], [5]]


async def test_a_key_is_never_twice_in_one_batch() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, limit=8, key=lambda a: a % 2)
    first = await _hold_first_batch(gate, coalescer)
    rest = [asyncio.create_task(coalescer.call(i)) for i in (1, 3, 2, 5)]
    await _until_waiting(coalescer, 4)
    gate.release.set()
    answers = await asyncio.wait_for(asyncio.gather(first, *rest), BOUND)
    assert answers == [0, 10, 30, 20, 50]
    assert gate.batches == [[0], [1, 2], [3], [5]]


async def test_a_failed_batch_fails_each_of_its_calls_and_no_other() -> None:
    calls: list[list[int]] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def batch(args: Sequence[int]) -> list[int]:
        calls.append(list(args))
        if len(calls) == 1:
            entered.set()
            await release.wait()
        if 13 in args:
            raise ValueError("bad luck")
        return list(args)

    coalescer = Coalescer(batch, limit=2)
    first = asyncio.create_task(coalescer.call(1))
    await asyncio.wait_for(entered.wait(), BOUND)
    doomed = [asyncio.create_task(coalescer.call(i)) for i in (13, 2)]
    fine = asyncio.create_task(coalescer.call(3))
    await _until_waiting(coalescer, 3)
    release.set()
    assert await asyncio.wait_for(first, BOUND) == 1
    for task in doomed:
        with pytest.raises(ValueError, match="bad luck"):
            await asyncio.wait_for(task, BOUND)
    assert await asyncio.wait_for(fine, BOUND) == 3
    assert calls == [[1], [13, 2], [3]]


async def test_a_cancelled_waiting_call_is_left_out_and_the_others_go_on() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, limit=8)
    first = await _hold_first_batch(gate, coalescer)
    gone = asyncio.create_task(coalescer.call(7))
    kept = asyncio.create_task(coalescer.call(8))
    await _until_waiting(coalescer, 2)
    gone.cancel()
    # the caller of the batch in flight gives up too: its batch still ends for the record
    first.cancel()
    gate.release.set()
    assert await asyncio.wait_for(kept, BOUND) == 80
    assert gate.batches == [[0], [8]]
    for task in (gone, first):
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_batch_that_answers_the_wrong_count_fails_its_calls() -> None:
    async def short(args: Sequence[int]) -> list[int]:
        return []

    coalescer = Coalescer(short, limit=4)
    with pytest.raises(RuntimeError, match="answered 0 of 1"):
        await asyncio.wait_for(coalescer.call(1), BOUND)


def test_the_limit_is_at_least_one() -> None:
    async def batch(args: Sequence[int]) -> list[int]:
        return list(args)

    with pytest.raises(ValueError, match="at least 1"):
        Coalescer(batch, limit=0)


async def test_when_the_sender_is_cancelled_no_call_is_left_waiting() -> None:
    gate = Gate()
    coalescer = Coalescer(gate, limit=8)
    first = await _hold_first_batch(gate, coalescer)
    later = asyncio.create_task(coalescer.call(1))
    await _until_waiting(coalescer, 1)
    sender = coalescer._sender
    assert sender is not None
    sender.cancel()  # as at the loop's shutdown
    for task in (first, later):
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, BOUND)
    assert coalescer.waiting == 0 and coalescer._sender is None
