"""Named crash points for fault-injection tests: a real SIGKILL, no exception, no cleanup.

``TESSERA_CRASH_AT=<point>[:<nth>]`` arms one point: the ``nth`` time (default 1) the process
reaches it, it kills itself with SIGKILL. Unset, :func:`crash_point` is a dictionary lookup.
The points are listed in :data:`POINTS` (and in docs/architecture.md).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from shared.core.errors import ConfigError

__all__ = ["POINTS", "arm", "crash_point"]

POINTS = frozenset(
    {
        "worker.before_lease",
        "worker.after_lease",  # after the lease and fence, before the first checkpoint
        "worker.before_pointer",  # a checkpoint object written, the pointer not yet moved to it
        "worker.after_checkpoint",
        "worker.during_renew",  # between the renew request and its reply being used
        "worker.after_result_write",  # tile result in the object store, not yet committed
        # every tile of a run rendered (or ended), results written, none of them committed
        "worker.after_run_rendered",
        "worker.after_commit",  # committed in Postgres, tile-done not yet published
        "worker.before_tiles_done",  # the job's last commit announced, tiles-done not yet out
        "worker.before_copy_release",  # a copy with nothing to render settled, its lease held
        "worker.blender_mid_pass",  # Blender is rendering a pass (request sent, no reply yet)
        "worker.before_ack",  # tile-done (and tiles-done) published, message not yet acked
        # acked after a commit that did not ask (another run of its job owns a tile)
        "worker.after_deferred_ack",
        # a run message in hand waits for a turn (one started run per kernel thread and one
        # more), nothing of it started
        "worker.run_waiting",
        "worker.before_run_settle",  # every tile of a run has its outcome, the message unsettled
        "worker.after_pause_checkpoint",  # paused job: checkpoint written, tile still leased
        "worker.before_unrelease",  # paused job: about to hand the tile back unreleased
        "finalizer.after_finalizing",  # job moved to finalizing, nothing written yet
        "finalizer.after_image_write",  # final image written, metadata not yet updated
        "finalizer.after_complete",  # job completed, tiles-done not yet acked
        "scheduler.after_plan",  # tile rows written (unreleased), the dispatcher not yet woken
        "scheduler.after_release",  # tiles released (rows stamped), none of them published
        "scheduler.mid_publish",  # half of a release's messages published, the rest not
    }
)

_armed: dict[str, int] = {}


def arm(env: Mapping[str, str]) -> None:
    """Arm the point named by ``TESSERA_CRASH_AT`` in ``env`` (no-op when unset)."""
    _armed.clear()
    raw = env.get("TESSERA_CRASH_AT", "").strip()
    if not raw:
        return
    point, _, nth = raw.partition(":")
    if point not in POINTS:
        raise ConfigError(f"TESSERA_CRASH_AT={raw!r}: unknown point; known: {sorted(POINTS)}")
    try:
        count = int(nth) if nth else 1
    except ValueError:
        raise ConfigError(f"TESSERA_CRASH_AT={raw!r}: nth must be an integer") from None
    if count < 1:
        raise ConfigError(f"TESSERA_CRASH_AT={raw!r}: nth must be >= 1")
    _armed[point] = count


def crash_point(name: str) -> None:
    """SIGKILL this process if ``name`` is armed and this is its nth arrival."""
    if name not in _armed:
        return
    _armed[name] -= 1
    if _armed[name] == 0:
        # One unbuffered line in the log, so a test can tell this death from any other.
        os.write(2, f"tessera: crash point {name} reached; SIGKILL\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
