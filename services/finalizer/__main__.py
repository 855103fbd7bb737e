"""``tessera finalizer`` / ``python -m services.finalizer``: wiring only."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from proto import names as n
from services.finalizer.assemble import Finalizer
from shared.service.consume import consume
from shared.service.runtime import Runtime, service_main


async def run(rt: Runtime, stop: asyncio.Event) -> None:
    """Finalize jobs until ``stop``."""
    finalizer = Finalizer(rt)
    read_ahead = await finalizer.subscribe_read_ahead() if finalizer.reads_ahead else None
    try:
        await consume(
            rt.js,
            stream=rt.names.stream(n.STREAM_EVENTS),
            durable=n.CONSUMER_FINALIZER,
            handler=finalizer.handle,
            in_hand=rt.settings.finalizer.in_hand,
            stop=stop,
            log=rt.log,
            grace=rt.settings.process.grace_period,
        )
    finally:
        if read_ahead is not None:
            with contextlib.suppress(Exception):
                await read_ahead.unsubscribe()


def main() -> int:
    """Run the finalizer until SIGTERM."""
    return service_main("finalizer", run)


if __name__ == "__main__":
    sys.exit(main())
