"""The worker's entry in the live-workers bucket: announced at start, refreshed every
:data:`~shared.nats.presence.REFRESH` s with the tiles in hand, deleted on a clean stop.

A failed refresh is logged and retried at the next tick; it never stops the worker (the key
expires after its TTL, and the dispatcher then counts this worker's threads out of the window
until a refresh lands again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version

from proto import names as n
from shared.core.errors import RetryableError, TerminalError
from shared.nats.presence import REFRESH, LiveWorkers, WorkerInfo
from shared.service.runtime import Runtime

__all__ = ["Presence"]


def _tessera_version() -> str:
    try:
        return version("tessera")
    except PackageNotFoundError:
        return "unknown"


class Presence:
    """Keeps one worker's ``worker.<node>`` key alive."""

    def __init__(
        self,
        rt: Runtime,
        *,
        threads: int,
        in_hand: int,
        current: Callable[[], list[list[object]]],
        renderers: Mapping[str, str],
        interval: float = REFRESH,
    ) -> None:
        self.rt = rt
        self.bucket = LiveWorkers(rt.js, rt.names.bucket(n.BUCKET_WORKERS))
        self.threads, self.in_hand, self.current = threads, in_hand, current
        #: the renderers this worker runs: name -> version
        self.renderers = dict(renderers)
        self.interval = interval
        self.started_at = time.time()
        self.version = _tessera_version()
        self.log = rt.log.bind(component="presence")

    def info(self) -> WorkerInfo:
        """This worker as announced now."""
        return WorkerInfo(
            node=self.rt.node,
            threads=self.threads,
            in_hand=self.in_hand,
            renderers=self.renderers,
            version=self.version,
            started_at=self.started_at,
            current=self.current(),
            room=True,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh until ``stop``, then delete the key."""
        while not stop.is_set():
            try:
                await self.bucket.put(self.info())
            except (RetryableError, TerminalError) as exc:
                self.log.warning("live-worker refresh failed; next tick retries", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
        try:
            await self.bucket.remove(self.rt.node)
        except (RetryableError, TerminalError) as exc:
            self.log.warning("live-worker key not deleted; it expires", error=str(exc))
