"""The job and tile state machines: pure functions, no asyncio, NATS or SQL.

Every status write goes through :func:`transition_job` or :func:`transition_tile`; an illegal
move raises :class:`IllegalTransition`. Duplicate "more of the same" events are self-loops (a
redelivered plan, a second finalizer after a crash), never errors; moving backwards or out of a
terminal state is illegal. A ``-`` cell below is illegal.

Job (``FR`` failed_retryable, ``FT`` failed_terminal, ``DL`` dead_lettered, ``progr.``
progressing, ``final.`` finalizing, ``queue`` queued)::

             planned started progress all_done finalized retryable terminal dead cancel retry pause
    queued   running progr.  progr.   -        -         FR        FT       DL   canc.  -     paused
    running  running progr.  progr.   final.   -         FR        FT       DL   canc.  -     paused
    progr.   progr.  progr.  progr.   final.   -         FR        FT       DL   canc.  -     paused
    paused   paused  -       paused   final.   -         FR        FT       DL   canc.  -     paused
    final.   -       -       -        final.   completed FR        FT       DL   canc.  -     -
    FR       running progr.  progr.   final.   -         FR        FT       DL   canc.  queue paused
    FT, DL   -       -       -        -        -         -         -        -    -      queue -
    completed, cancelled: no moves.
    result_lost: finalizing -> progressing only. resume: paused -> running only.

``failed_retryable`` is "the last attempt failed, the system will try again": any forward event
(a redelivered plan or tile-done) resumes the job; an operator ``retry`` restarts it.

Tile::

                 lease   progress  commit  retryable  terminal  dead  lease_lost  requeue  cancel
    queued       leased  -         -       -          -         DL    -           queued   canc.
    leased       leased  progr.    done    FR         FT        DL    queued      -        canc.
    progressing  leased  progr.    done    FR         FT        DL    queued      -        canc.
    FR           leased  -         -       -          -         DL    -           queued   canc.
    FT, DL       -       -         -       -          -         -     -           queued   -
    pause: queued, leased, progressing, FR -> queued (unreleased; the checkpoint stays).
    done: result_lost -> queued only (a late duplicate commit on a done tile is illegal).
    cancelled: no moves.

Re-leasing a ``leased``/``progressing`` tile is legal: its previous owner crashed and the lease
expired (the lease itself, not this table, decides who may take it). ``requeue`` from ``queued``
is the sweeper re-publishing a lost message. Tiles have a ``cancelled`` state (not in the
design's list) so a worker that sees its job cancelled mid-render records why it stopped instead
of leaving the tile ``progressing`` forever. ``result_lost`` is the finalizer finding a committed
result missing or corrupt: the tile is rendered again and the job goes back to rendering.
"""

from __future__ import annotations

from enum import StrEnum

from shared.core.errors import TerminalError


class IllegalTransition(TerminalError):
    """The event is not allowed in the current state (names both)."""

    code = "illegal_state"


class JobState(StrEnum):
    """Where a job is; the values are the strings stored in the metadata store."""

    QUEUED = "queued"
    RUNNING = "running"
    PROGRESSING = "progressing"
    #: an operator paused it: nothing is released, in-flight tiles checkpoint and hand back
    PAUSED = "paused"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED_RETRYABLE = "failed_retryable"
    FAILED_TERMINAL = "failed_terminal"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"


class TileState(StrEnum):
    """Where a tile is; the values are the strings stored in the metadata store."""

    QUEUED = "queued"
    LEASED = "leased"
    PROGRESSING = "progressing"
    DONE = "done"
    FAILED_RETRYABLE = "failed_retryable"
    FAILED_TERMINAL = "failed_terminal"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"


class JobTrigger(StrEnum):
    """What happened to a job."""

    TILES_PLANNED = "tiles_planned"
    TILE_STARTED = "tile_started"
    TILE_PROGRESS = "tile_progress"
    ALL_TILES_DONE = "all_tiles_done"
    FINALIZED = "finalized"
    RETRYABLE_FAILURE = "retryable_failure"
    TERMINAL_FAILURE = "terminal_failure"
    DEAD_LETTER = "dead_letter"
    CANCEL = "cancel"
    RETRY = "retry"
    #: finalization found a committed tile result missing or corrupt: back to rendering
    RESULT_LOST = "result_lost"
    #: an operator paused the job
    PAUSE = "pause"
    #: an operator resumed a paused job
    RESUME = "resume"


class TileTrigger(StrEnum):
    """What happened to a tile."""

    LEASE = "lease"
    PROGRESS = "progress"
    COMMIT = "commit"
    RETRYABLE_FAILURE = "retryable_failure"
    TERMINAL_FAILURE = "terminal_failure"
    DEAD_LETTER = "dead_letter"
    LEASE_LOST = "lease_lost"
    REQUEUE = "requeue"
    CANCEL = "cancel"
    #: its committed result is missing or corrupt (found at finalization): render it again
    RESULT_LOST = "result_lost"
    #: its job was paused: back to queued and unreleased (its checkpoint stays)
    PAUSE = "pause"


TERMINAL_JOB_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED_TERMINAL, JobState.DEAD_LETTERED, JobState.CANCELLED}
)
"""No work happens for a job in these states (only ``retry`` leaves FT and DL)."""

TERMINAL_TILE_STATES = frozenset(
    {TileState.DONE, TileState.FAILED_TERMINAL, TileState.DEAD_LETTERED, TileState.CANCELLED}
)
"""No work happens for a tile in these states (only ``requeue`` leaves FT and DL)."""

J, JT = JobState, JobTrigger
_JOB_ACTIVE = (J.QUEUED, J.RUNNING, J.PROGRESSING, J.PAUSED, J.FINALIZING, J.FAILED_RETRYABLE)
_JOB_PAUSABLE = (J.QUEUED, J.RUNNING, J.PROGRESSING, J.FAILED_RETRYABLE)
_JOB_TABLE: dict[tuple[JobState, JobTrigger], JobState] = {
    **{(s, JT.RETRYABLE_FAILURE): J.FAILED_RETRYABLE for s in _JOB_ACTIVE},
    **{(s, JT.TERMINAL_FAILURE): J.FAILED_TERMINAL for s in _JOB_ACTIVE},
    **{(s, JT.DEAD_LETTER): J.DEAD_LETTERED for s in _JOB_ACTIVE},
    **{(s, JT.CANCEL): J.CANCELLED for s in _JOB_ACTIVE},
    **{(s, JT.RETRY): J.QUEUED for s in (J.FAILED_RETRYABLE, J.FAILED_TERMINAL, J.DEAD_LETTERED)},
    (J.QUEUED, JT.TILES_PLANNED): J.RUNNING,
    (J.RUNNING, JT.TILES_PLANNED): J.RUNNING,
    (J.PROGRESSING, JT.TILES_PLANNED): J.PROGRESSING,
    (J.FAILED_RETRYABLE, JT.TILES_PLANNED): J.RUNNING,
    **{
        (s, t): J.PROGRESSING
        for s in (J.QUEUED, J.RUNNING, J.PROGRESSING, J.FAILED_RETRYABLE)
        for t in (JT.TILE_STARTED, JT.TILE_PROGRESS)
    },
    **{
        (s, JT.ALL_TILES_DONE): J.FINALIZING
        for s in (J.RUNNING, J.PROGRESSING, J.FINALIZING, J.FAILED_RETRYABLE)
    },
    (J.FINALIZING, JT.FINALIZED): J.COMPLETED,
    (J.FINALIZING, JT.RESULT_LOST): J.PROGRESSING,
    **{(s, JT.PAUSE): J.PAUSED for s in _JOB_PAUSABLE},
    (J.PAUSED, JT.PAUSE): J.PAUSED,
    (J.PAUSED, JT.RESUME): J.RUNNING,
    # A paused job stays paused while its plan lands and in-flight tiles commit; once every
    # tile is done there is nothing left to pause, so it finalizes.
    (J.PAUSED, JT.TILES_PLANNED): J.PAUSED,
    (J.PAUSED, JT.TILE_PROGRESS): J.PAUSED,
    (J.PAUSED, JT.ALL_TILES_DONE): J.FINALIZING,
}

T, TT = TileState, TileTrigger
_TILE_WORKING = (T.LEASED, T.PROGRESSING)
_TILE_OPEN = (T.QUEUED, T.LEASED, T.PROGRESSING, T.FAILED_RETRYABLE)
_TILE_TABLE: dict[tuple[TileState, TileTrigger], TileState] = {
    **{(s, TT.LEASE): T.LEASED for s in (*_TILE_WORKING, T.QUEUED, T.FAILED_RETRYABLE)},
    **{(s, TT.PROGRESS): T.PROGRESSING for s in _TILE_WORKING},
    **{(s, TT.COMMIT): T.DONE for s in _TILE_WORKING},
    **{(s, TT.RETRYABLE_FAILURE): T.FAILED_RETRYABLE for s in _TILE_WORKING},
    **{(s, TT.TERMINAL_FAILURE): T.FAILED_TERMINAL for s in _TILE_WORKING},
    **{(s, TT.LEASE_LOST): T.QUEUED for s in _TILE_WORKING},
    **{(s, TT.DEAD_LETTER): T.DEAD_LETTERED for s in _TILE_OPEN},
    **{(s, TT.CANCEL): T.CANCELLED for s in _TILE_OPEN},
    **{
        (s, TT.REQUEUE): T.QUEUED
        for s in (T.QUEUED, T.FAILED_RETRYABLE, T.FAILED_TERMINAL, T.DEAD_LETTERED)
    },
    (T.DONE, TT.RESULT_LOST): T.QUEUED,
    **{(s, TT.PAUSE): T.QUEUED for s in _TILE_OPEN},
}
del J, JT, T, TT


def transition_job(state: JobState, event: JobTrigger) -> JobState:
    """The job's next state, or :class:`IllegalTransition`."""
    try:
        return _JOB_TABLE[JobState(state), JobTrigger(event)]
    except (KeyError, ValueError):
        raise IllegalTransition(f"job: {event!s} is illegal in state {state!s}") from None


def transition_tile(state: TileState, event: TileTrigger) -> TileState:
    """The tile's next state, or :class:`IllegalTransition`."""
    try:
        return _TILE_TABLE[TileState(state), TileTrigger(event)]
    except (KeyError, ValueError):
        raise IllegalTransition(f"tile: {event!s} is illegal in state {state!s}") from None


def is_terminal(state: JobState | TileState) -> bool:
    """True if no work happens in ``state`` (see the ``TERMINAL_*`` sets)."""
    if isinstance(state, JobState):
        return state in TERMINAL_JOB_STATES
    return TileState(state) in TERMINAL_TILE_STATES


def job_legal_events(state: JobState) -> frozenset[JobTrigger]:
    """Events legal for a job in ``state`` (for error messages and operator tools)."""
    return frozenset(e for (s, e) in _JOB_TABLE if s == state)


def tile_legal_events(state: TileState) -> frozenset[TileTrigger]:
    """Events legal for a tile in ``state``."""
    return frozenset(e for (s, e) in _TILE_TABLE if s == state)
