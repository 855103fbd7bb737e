"""Run turns (:class:`services.worker.context.RunTurns`): a bounded number of started runs (the
worker: one per kernel thread and one more), a new one only while the started ones have few
tiles left to render, the others waiting in hand unstarted, their messages' deadlines kept,
handed back on a drain."""

from __future__ import annotations

import asyncio

import pytest

from services.worker.context import RunTurn, RunTurns
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
        tiles: int = 1,
    ) -> None:
        self.delivery = FakeDelivery(b"")
        self.done = asyncio.Event()
        self.got: bool | None = None
        self.turn: RunTurn | None = None

        async def go() -> None:
            async with turns.turn(self.delivery, tiles, interval, back) as turn:
                self.got = turn is not None
                self.turn = turn
                if turn is not None:
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


async def test_a_run_waits_while_the_started_ones_have_more_tiles_left_than_the_lead() -> None:
    """Counted in tiles: the next run starts as the started runs' tiles left to render fall to
    the lead, not when a run ends; a run's count never goes below zero, and its tiles still
    pending when it ends are given back with its turn."""
    turns, back, started = RunTurns(3, lead=3), asyncio.Event(), list[str]()
    first = Run(turns, back, started, "first", tiles=8)
    await eventually(lambda: started == ["first"], timeout=5, what="the first run started")
    second = Run(turns, back, started, "second", tiles=8)
    await eventually(lambda: turns.waiting == 1, timeout=5, what="the second run waiting")
    assert turns.pending == 8 and turns.started == 1
    assert first.turn is not None
    for _ in range(4):
        first.turn.left()
    # (a turn is passed on synchronously, inside ``left``: the waiter's future set at once)
    assert turns.waiting == 1 and turns.started == 1, "4 tiles left, lead 3: still waiting"
    assert turns.pending == 4
    first.turn.left()
    await eventually(lambda: started == ["first", "second"], timeout=5, what="the second run")
    assert turns.pending == 3 + 8 and turns.started == 2
    third = Run(turns, back, started, "third", tiles=8)
    await eventually(lambda: turns.waiting == 1, timeout=5, what="the third run waiting")
    first.done.set()  # its 3 tiles never rendered (it ended otherwise): no longer pending
    await eventually(lambda: turns.pending == 8 and turns.started == 1, timeout=5,
                     what="the first run's turn and tiles given back")  # fmt: skip
    assert started == ["first", "second"], "8 tiles of the second left: the third still waits"
    assert second.turn is not None
    for _ in range(8):
        second.turn.left()
        second.turn.left()  # (more calls than tiles: counted down to 0, never below)
    await eventually(lambda: started == ["first", "second", "third"], timeout=5, what="third")
    assert turns.pending == 8
    second.done.set()
    third.done.set()
    await asyncio.wait_for(asyncio.gather(first.task, second.task, third.task), 5)
    assert turns.started == 0 and turns.pending == 0 and turns.waiting == 0


async def test_runs_whose_tiles_render_at_once_start_up_to_the_turns() -> None:
    """Tiles that render on the loop at once leave nothing pending: the turns alone bound."""
    turns, back, started = RunTurns(2, lead=1), asyncio.Event(), list[str]()
    a = Run(turns, back, started, "a", tiles=16)
    await eventually(lambda: a.turn is not None, timeout=5, what="the first run started")
    assert a.turn is not None
    for _ in range(16):
        a.turn.left()
    b = Run(turns, back, started, "b", tiles=16)
    await eventually(lambda: b.turn is not None, timeout=5, what="the second run started")
    assert b.turn is not None
    for _ in range(16):
        b.turn.left()
    c = Run(turns, back, started, "c", tiles=16)
    await eventually(lambda: turns.waiting == 1, timeout=5, what="the third run waiting")
    assert started == ["a", "b"], "two turns, both held (their tiles wait for their commits)"
    a.done.set()
    await eventually(lambda: started == ["a", "b", "c"], timeout=5, what="the third run")
    b.done.set()
    c.done.set()
    await asyncio.wait_for(asyncio.gather(a.task, b.task, c.task), 5)
    assert turns.started == 0 and turns.pending == 0


async def test_a_run_handed_back_while_waiting_leaves_no_tiles_pending() -> None:
    turns, back, started = RunTurns(1, lead=0), asyncio.Event(), list[str]()
    first = Run(turns, back, started, "first", tiles=4)
    await eventually(lambda: started == ["first"], timeout=5, what="the first run started")
    waiting = Run(turns, back, started, "waiting", tiles=4)
    await eventually(lambda: turns.waiting == 1, timeout=5, what="a run waiting")
    back.set()
    await asyncio.wait_for(waiting.task, 5)
    assert waiting.got is False and turns.pending == 4
    first.done.set()
    await asyncio.wait_for(first.task, 5)
    assert turns.started == 0 and turns.pending == 0
