"""Run turns (:class:`services.worker.context.RunTurns`): a bounded number of started runs (the
worker: one per kernel thread and one more), the others waiting in hand unstarted, their
messages' deadlines kept, handed back on a drain."""

from __future__ import annotations

import asyncio

import pytest

from services.worker.context import RunTurns
from tests.doubles.delivery import FakeDelivery
from tests.helpers import eventually

#: a heartbeat interval no test waits for: a turn passed on, or a drain, must wake a waiting
#: run at once, not at its next deadline reset
LONG = 60.0


class Run:
    """A run asking for a turn: holds it until ``done`` is set; records what it got."""

    def __init__(
        self,
        turns: RunTurns,
        back: asyncio.Event,
        started: list[str],
        name: str,
        interval: float = LONG,
    ) -> None:
        self.delivery = FakeDelivery(b"")
        self.done = asyncio.Event()
        self.got: bool | None = None

        async def go() -> None:
            async with turns.turn(self.delivery, interval, back) as got:
                self.got = got
                if got:
                    started.append(name)
                    await self.done.wait()

        self.task = asyncio.create_task(go())


async def test_a_run_beyond_the_turns_waits_and_starts_in_order_as_soon_as_one_ends():
    turns, back, started = RunTurns(1), asyncio.Event(), list[str]()
    first = Run(turns, back, started, "first")
    await eventually(lambda: started == ["first"], timeout=5, what="the first run started")
    second, third = Run(turns, back, started, "second"), Run(turns, back, started, "third")
    await eventually(lambda: turns.waiting == 2, timeout=5, what="two runs waiting")
    assert started == ["first"] and turns.started == 1
    first.done.set()
    await eventually(lambda: started == ["first", "second"], timeout=5, what="the next in order")
    second.done.set()
    await eventually(lambda: started == ["first", "second", "third"], timeout=5, what="the third")
    third.done.set()
    await asyncio.wait_for(asyncio.gather(first.task, second.task, third.task), 5)
    assert turns.started == 0 and turns.waiting == 0
    assert first.delivery.in_progress_calls == 0, "a run that started at once waited for nothing"


async def test_a_waiting_run_resets_its_messages_deadline_once_an_interval():
    turns, back, started = RunTurns(1), asyncio.Event(), list[str]()
    first = Run(turns, back, started, "first")
    await eventually(lambda: started == ["first"], timeout=5, what="the first run started")
    second = Run(turns, back, started, "second", interval=0.05)
    await eventually(lambda: second.delivery.in_progress_calls >= 2, timeout=5,
                     what="the waiting run's deadline reset")  # fmt: skip
    assert started == ["first"]
    first.done.set()
    await eventually(lambda: started == ["first", "second"], timeout=5, what="its turn")
    second.done.set()
    await asyncio.wait_for(asyncio.gather(first.task, second.task), 5)


async def test_two_turns_start_two_runs_at_once():
    turns, back, started = RunTurns(2), asyncio.Event(), list[str]()
    runs = [Run(turns, back, started, name) for name in ("a", "b", "c")]
    await eventually(lambda: sorted(started) == ["a", "b"] and turns.waiting == 1, timeout=5,
                     what="two started, one waiting")  # fmt: skip
    for run in runs:
        run.done.set()
    await asyncio.wait_for(asyncio.gather(*(r.task for r in runs)), 5)
    assert sorted(started) == ["a", "b", "c"] and turns.started == 0


async def _one_started_one_waiting(
    turns: RunTurns, back: asyncio.Event, started: list[str]
) -> tuple[Run, Run]:
    first = Run(turns, back, started, "first")
    await eventually(lambda: started == ["first"], timeout=5, what="the first run started")
    waiting = Run(turns, back, started, "waiting")
    await eventually(lambda: turns.waiting == 1, timeout=5, what="a run waiting")
    return first, waiting


async def test_a_drain_hands_a_waiting_run_back_unstarted():
    turns, back, started = RunTurns(1), asyncio.Event(), list[str]()
    first, waiting = await _one_started_one_waiting(turns, back, started)
    back.set()
    await asyncio.wait_for(waiting.task, 5)
    assert waiting.got is False and started == ["first"]
    first.done.set()
    await asyncio.wait_for(first.task, 5)
    assert turns.started == 0 and turns.waiting == 0


async def test_a_waiting_run_that_is_cancelled_leaves_no_turn_behind():
    turns, back, started = RunTurns(1), asyncio.Event(), list[str]()
    first, gone = await _one_started_one_waiting(turns, back, started)
    gone.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone.task
    later = Run(turns, back, started, "later")
    await eventually(lambda: turns.waiting == 1, timeout=5, what="the later run waiting")
    first.done.set()
    await eventually(lambda: started == ["first", "later"], timeout=5, what="the turn passed on")
    later.done.set()
    await asyncio.wait_for(asyncio.gather(first.task, later.task), 5)
    assert turns.started == 0


def test_at_least_one_turn() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RunTurns(0)


async def test_a_run_given_its_turn_after_waiting_resets_its_messages_deadline_at_once():
    """Its last reset may be an interval old, and its tiles' heartbeats reset it only an
    interval after their leases: the turn resets it as it starts."""
    turns, back, started = RunTurns(1), asyncio.Event(), list[str]()
    first, waiting = await _one_started_one_waiting(turns, back, started)
    assert waiting.delivery.in_progress_calls == 0, "the interval (60 s) has not passed"
    first.done.set()
    await eventually(lambda: started == ["first", "waiting"], timeout=5, what="its turn")
    assert waiting.delivery.in_progress_calls == 1
    waiting.done.set()
    await asyncio.wait_for(asyncio.gather(first.task, waiting.task), 5)


async def test_during_a_drain_no_run_starts_even_with_a_turn_free_or_handed_over():
    turns, back, started = RunTurns(1), asyncio.Event(), list[str]()
    first, waiting = await _one_started_one_waiting(turns, back, started)
    # the drain begins in the same turn of the loop as the first run ends
    back.set()
    first.done.set()
    await asyncio.wait_for(asyncio.gather(first.task, waiting.task), 5)
    assert waiting.got is False and started == ["first"]
    late = Run(turns, back, started, "late")  # a turn is free: still nothing starts
    await asyncio.wait_for(late.task, 5)
    assert late.got is False and turns.started == 0 and turns.waiting == 0
