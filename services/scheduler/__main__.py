"""``tessera scheduler`` / ``python -m services.scheduler``: wiring only."""

from __future__ import annotations

import asyncio
import sys

from proto import names as n
from services.scheduler.collector import StreamCollector
from services.scheduler.deadlines import Deadlines
from services.scheduler.dispatch import Dispatcher
from services.scheduler.exhausted import Exhausted
from services.scheduler.planner import Planner
from services.scheduler.sweeper import Sweeper
from shared.service.consume import consume
from shared.service.runtime import Runtime, service_main


def planning(rt: Runtime) -> tuple[Planner, Dispatcher, Deadlines]:
    """The planner, wired to wake the dispatcher (the new tiles) and the deadline check (the
    job's deadline may be the earliest) after each plan."""
    dispatcher, deadlines = Dispatcher(rt), Deadlines(rt)

    def planned() -> None:
        dispatcher.nudge()
        deadlines.nudge()

    return Planner(rt, on_planned=planned), dispatcher, deadlines


async def run(rt: Runtime, stop: asyncio.Event) -> None:
    """Plan jobs, release their tiles, dead-letter exhausted messages, sweep, fail overdue
    jobs and collect metrics."""
    names, grace = rt.names, rt.settings.process.grace_period
    config = rt.settings.scheduler
    planner, dispatcher, deadlines = planning(rt)
    exhausted, sweeper = Exhausted(rt), Sweeper(rt)
    await asyncio.gather(
        consume(
            rt.js,
            stream=names.stream(n.STREAM_JOBS),
            durable=n.CONSUMER_SCHEDULER_JOBS,
            handler=planner.handle,
            in_hand=config.jobs_in_hand,
            stop=stop,
            log=rt.log,
            grace=grace,
        ),
        consume(
            rt.js,
            stream=names.stream(n.STREAM_ADVISORIES),
            durable=n.CONSUMER_SCHEDULER_ADVISORIES,
            handler=exhausted.handle,
            in_hand=config.advisories_in_hand,
            stop=stop,
            log=rt.log,
            grace=grace,
        ),
        dispatcher.run(stop),
        sweeper.run(stop),
        deadlines.run(stop),
        StreamCollector(rt).run(stop),
    )


def main() -> int:
    """Run the scheduler until SIGTERM."""
    return service_main("scheduler", run)


if __name__ == "__main__":
    sys.exit(main())
