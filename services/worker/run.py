"""One TILES delivery: a single tile, or a run of short tiles that share the message.

The dispatcher sends consecutive short tiles of a job released together as one message
(:mod:`shared.core.runs`, docs/architecture.md "Runs of short tiles"). Each tile of a run is
processed by its own :class:`~services.worker.tile.TileRun`, side by side, exactly as a message
of its own would be — its own lease, fence, render, fenced commit and tile-done event — except
that their result writes and commits wait for one another
(:class:`~services.worker.context.RunCommits`: once none of the run's tiles is still rendering,
their results are written in one call and their commits go together, one statement) and
that none of them settles the message: their outcomes are combined
(:func:`~shared.service.settle.combine`) and the message is settled once, after the last tile's
outcome (crash point ``worker.before_run_settle``). Their heartbeats all extend the one
message's ack deadline. A worker starts one run per kernel thread and one more at a time,
and a new one only while the started runs have at most as many tiles left to render; a run
message beyond that waits in hand unstarted (:class:`~services.worker.context.RunTurns`).

A redelivered run finds its done tiles done (re-announced, nothing rendered) and renders the
rest, as a redelivered single tile does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from proto.messages import TileMessage
from services.worker.context import Result, RunCommits, RunTurn, TileContext
from services.worker.tile import TileRun
from shared.core import crash
from shared.core.errors import DecodeError
from shared.service.settle import HAND_BACK, Ack, Delivery, Outcome, combine, settle

__all__ = ["handle"]


async def handle(
    ctx: TileContext,
    delivery: Delivery,
    holding: Callable[[TileMessage], None] | None = None,
) -> None:
    """Process one TILES delivery and settle it exactly once (a run: once for all its tiles);
    ``holding`` is told which tiles the message carries once it is decoded."""
    try:
        message = TileMessage.decode(delivery.data)
    except DecodeError:
        await TileRun(ctx, delivery).run()  # dead-letters the garbage, naming the job
        return
    if holding is not None:
        holding(message)
    if message.run == 1:
        await TileRun(ctx, delivery, message).run()
        return
    interval = ctx.lease_config.heartbeat_interval
    tiles = len(message.tiles)
    async with ctx.turns.turn(delivery, tiles, interval, ctx.stop.handing_back) as turn:
        if turn is not None:
            await _run(ctx, delivery, message, turn)
        else:  # the worker hands its messages back: the run goes back whole, nothing started
            await settle(delivery, HAND_BACK)


async def _run(ctx: TileContext, delivery: Delivery, message: TileMessage, turn: RunTurn) -> None:
    """Every tile of the run side by side, then the message settled once; the turn is told of
    each tile as it stops rendering."""

    async def write(results: list[Result]) -> None:  # (not made durable: see TileRun._commit)
        await ctx.store.put_many(results, durable=False)

    commits = RunCommits(message.tiles, turn.left, write)
    runs = [TileRun(ctx, delivery, message.single(i), commits) for i in message.tiles]
    for r in runs:  # each tile's lines name the run its message carried
        r.log = r.log.bind(run=message.run, run_first=message.tile_index)

    async def outcome(r: TileRun, tile_index: int) -> Outcome:
        try:
            return await r.outcome()
        finally:  # (any outcome, or a bug): the run's other commits wait for it no longer
            commits.ended(tile_index)

    results = await asyncio.gather(
        *(outcome(r, i) for r, i in zip(runs, message.tiles, strict=True)),
        return_exceptions=True,
    )
    outcomes: list[Outcome] = []
    for result in results:
        if isinstance(result, BaseException):
            # A bug in one tile's steps (or its cancellation): like a single tile's, the
            # message is left to come back after ack_wait; its done tiles are found done.
            raise result
        outcomes.append(result)
    crash.crash_point("worker.before_run_settle")
    settled = combine(outcomes)
    await settle(delivery, settled)
    if any(r.deferred for r in runs) and isinstance(settled, Ack):
        crash.crash_point("worker.after_deferred_ack")
    for r in runs:
        r.settled()
