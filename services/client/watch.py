"""``tessera watch``: live progress of one or more jobs until each is terminal.

Progress comes from ``status`` replies. The watcher also follows ``tessera.events.<job>.>``
(tile-done and job events), which only *wakes* it to ask for status sooner; if events are lost
(or EVENTS is unreachable) it still polls every ``interval`` seconds, so it never waits on a
message that will not come. Bursts of events are coalesced to at most one status round every
:data:`MIN_REFRESH` seconds.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from tqdm import tqdm

from proto.names import EventKind
from services.client.api import TesseraClient
from services.client.output import percent
from services.client.session import EXIT_JOB_FAILED, EXIT_OK
from shared.core.lifecycle import TERMINAL_JOB_STATES, JobState

__all__ = ["MIN_REFRESH", "ProgressBars", "watch_jobs"]

MIN_REFRESH = 0.2
_TERMINAL = {state.value for state in TERMINAL_JOB_STATES}


def is_terminal(reply: dict[str, Any]) -> bool:
    """True if the status reply's job will not change any more (short of a retry)."""
    return reply["state"] in _TERMINAL


class ProgressBars:
    """One tqdm bar per job (tiles done of total, with ETA), on stderr."""

    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        many = len(statuses) > 1
        self.bars = {
            s["job_id"]: tqdm(
                total=max(s["tiles_total"], 1),
                desc=f"frame {s['frame']}" if many else s["job_id"][:13],
                unit="tile",
                position=i,
                file=sys.stderr,
                dynamic_ncols=True,
                leave=True,
            )
            for i, s in enumerate(statuses)
        }
        for s in statuses:
            self.update(s)

    def update(self, s: dict[str, Any]) -> None:
        """Show the latest status of one job."""
        bar = self.bars[s["job_id"]]
        bar.total = max(s["tiles_total"], 1)
        bar.n = s["tiles_done"]
        samples = percent(s["samples_done"], s["samples_total"])
        bar.set_postfix_str(f"{s['state']}, samples {samples}", refresh=False)
        bar.refresh()

    def close(self) -> None:
        """Leave the final bars on screen."""
        for bar in self.bars.values():
            bar.close()


def _events_of(client: TesseraClient, job_id: str) -> str:
    # every event of a job shares the subject up to its last token: tessera.events.<job>.>
    return client.names.event_subject(job_id, EventKind.JOB_COMPLETED).rsplit(".", 1)[0] + ".>"


async def _follow(client: TesseraClient, statuses: dict[str, dict[str, Any]],
                  bars: ProgressBars, interval: float) -> None:  # fmt: skip
    wake = asyncio.Event()

    async def on_event(_msg: object) -> None:
        wake.set()

    subs = [await client.nc.subscribe(_events_of(client, job), cb=on_event) for job in statuses]
    try:
        while not all(is_terminal(s) for s in statuses.values()):
            try:
                await asyncio.wait_for(wake.wait(), interval)
                await asyncio.sleep(MIN_REFRESH)
            except TimeoutError:
                pass
            wake.clear()
            for job_id in [j for j, s in statuses.items() if not is_terminal(s)]:
                statuses[job_id] = await client.status(job_id)
                bars.update(statuses[job_id])
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def watch_jobs(client: TesseraClient, job_ids: list[str], *, interval: float = 2.0) -> int:
    """Show progress until every job is terminal: 0 if all completed, else 1."""
    unique = list(dict.fromkeys(job_ids))
    first = [await client.status(job_id) for job_id in unique]
    statuses = {s["job_id"]: s for s in first}
    bars = ProgressBars(first)
    try:
        await _follow(client, statuses, bars, interval)
    finally:
        bars.close()
    for s in statuses.values():
        error = f" ({s['last_error_code']}: {s['last_error']})" if s.get("last_error_code") else ""
        print(f"{s['job_id']} {s['state']}{error}", flush=True)
    ok = all(s["state"] == JobState.COMPLETED for s in statuses.values())
    return EXIT_OK if ok else EXIT_JOB_FAILED
