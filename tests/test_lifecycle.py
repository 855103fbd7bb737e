"""Exhaustive tests of the job and tile state machines against explicit tables.

The expected tables are written out here by hand, independently of ``shared.core.lifecycle``'s own
construction: every (state, event) pair is checked, legal ones land where the grid says, the
rest raise ``IllegalTransition``.
"""

from __future__ import annotations

import itertools

import pytest

from shared.core.errors import TerminalError
from shared.core.lifecycle import (
    TERMINAL_JOB_STATES,
    TERMINAL_TILE_STATES,
    IllegalTransition,
    JobState,
    JobTrigger,
    TileState,
    TileTrigger,
    is_terminal,
    job_legal_events,
    tile_legal_events,
    transition_job,
    transition_tile,
)

# The first row names the events; every other row is a state; "-" is illegal.
JOB_GRID = """
state             tiles_planned tile_started tile_progress all_tiles_done finalized retryable_failure terminal_failure dead_letter cancel retry result_lost pause resume
queued            running     progressing progressing -          -         failed_retryable failed_terminal dead_lettered cancelled - -           paused -
running           running     progressing progressing finalizing -         failed_retryable failed_terminal dead_lettered cancelled - -           paused -
progressing       progressing progressing progressing finalizing -         failed_retryable failed_terminal dead_lettered cancelled - -           paused -
paused            paused      -           paused      finalizing -         failed_retryable failed_terminal dead_lettered cancelled - -           paused running
finalizing        -           -           -           finalizing completed failed_retryable failed_terminal dead_lettered cancelled - progressing -      -
completed         -           -           -           -          -         -                -               -             -         - -           -      -
failed_retryable  running     progressing progressing finalizing -         failed_retryable failed_terminal dead_lettered cancelled queued -      paused -
failed_terminal   -           -           -           -          -         -                -               -             -         queued -      -      -
dead_lettered     -           -           -           -          -         -                -               -             -         queued -      -      -
cancelled         -           -           -           -          -         -                -               -             -         - -           -      -
"""  # noqa: E501

TILE_GRID = """
state             lease progress commit retryable_failure terminal_failure dead_letter lease_lost requeue cancel result_lost pause
queued            leased -           -    -                -               dead_lettered -      queued cancelled -      queued
leased            leased progressing done failed_retryable failed_terminal dead_lettered queued -      cancelled -      queued
progressing       leased progressing done failed_retryable failed_terminal dead_lettered queued -      cancelled -      queued
done              -      -           -    -                -               -             -      -      - queued         -
failed_retryable  leased -           -    -                -               dead_lettered -      queued cancelled -      queued
failed_terminal   -      -           -    -                -               -             -      queued - -              -
dead_lettered     -      -           -    -                -               -             -      queued - -              -
cancelled         -      -           -    -                -               -             -      -      - -              -
"""  # noqa: E501


def parse(grid: str) -> tuple[list[str], dict[tuple[str, str], str | None]]:
    header, *rows = grid.strip().splitlines()
    events = header.split()[1:]
    table: dict[tuple[str, str], str | None] = {}
    for line in rows:
        state, *cells = line.split()
        assert len(cells) == len(events), line
        for event, cell in zip(events, cells, strict=True):
            table[state, event] = None if cell == "-" else cell
    return events, table


JOB_EVENTS, JOB_TABLE = parse(JOB_GRID)
TILE_EVENTS, TILE_TABLE = parse(TILE_GRID)


def test_tables_cover_every_state_and_event() -> None:
    assert {s for s, _ in JOB_TABLE} == {s.value for s in JobState}
    assert set(JOB_EVENTS) == {e.value for e in JobTrigger}
    assert {s for s, _ in TILE_TABLE} == {s.value for s in TileState}
    assert set(TILE_EVENTS) == {e.value for e in TileTrigger}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(JobState, JobTrigger)))
def test_job_transition(state: JobState, event: JobTrigger) -> None:
    expected = JOB_TABLE[state.value, event.value]
    if expected is None:
        with pytest.raises(IllegalTransition, match=f"{event.value}.*{state.value}"):
            transition_job(state, event)
        assert event not in job_legal_events(state)
    else:
        assert transition_job(state, event) is JobState(expected)
        assert event in job_legal_events(state)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(TileState, TileTrigger)))
def test_tile_transition(state: TileState, event: TileTrigger) -> None:
    expected = TILE_TABLE[state.value, event.value]
    if expected is None:
        with pytest.raises(IllegalTransition, match=f"{event.value}.*{state.value}"):
            transition_tile(state, event)
        assert event not in tile_legal_events(state)
    else:
        assert transition_tile(state, event) is TileState(expected)
        assert event in tile_legal_events(state)


def test_illegal_transition_is_terminal_with_api_code() -> None:
    assert issubclass(IllegalTransition, TerminalError)
    assert IllegalTransition.code == "illegal_state"


def test_plain_strings_from_the_database_are_accepted() -> None:
    assert transition_job("queued", "tiles_planned") is JobState.RUNNING  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition):
        transition_tile("bogus", "lease")  # type: ignore[arg-type]


def test_terminal_states() -> None:
    assert {s.value for s in TERMINAL_JOB_STATES} == {
        "completed",
        "failed_terminal",
        "dead_lettered",
        "cancelled",
    }
    assert {s.value for s in TERMINAL_TILE_STATES} == {
        "done",
        "failed_terminal",
        "dead_lettered",
        "cancelled",
    }
    assert all(is_terminal(s) == (s in TERMINAL_JOB_STATES) for s in JobState)
    assert all(is_terminal(s) == (s in TERMINAL_TILE_STATES) for s in TileState)


def test_cancel_is_legal_from_every_non_terminal_job_state() -> None:
    for state in set(JobState) - TERMINAL_JOB_STATES:
        assert transition_job(state, JobTrigger.CANCEL) is JobState.CANCELLED


def test_crashed_worker_flow() -> None:
    """A worker dies mid-render; the next one re-leases and commits; a late commit is refused."""
    tile = TileState.QUEUED
    for event in (TileTrigger.LEASE, TileTrigger.PROGRESS, TileTrigger.LEASE):
        tile = transition_tile(tile, event)
    tile = transition_tile(transition_tile(tile, TileTrigger.PROGRESS), TileTrigger.COMMIT)
    assert tile is TileState.DONE
    with pytest.raises(IllegalTransition):
        transition_tile(tile, TileTrigger.COMMIT)


def test_happy_job_flow_with_a_crashed_finalizer() -> None:
    job = JobState.QUEUED
    for event in (
        JobTrigger.TILES_PLANNED,
        JobTrigger.TILE_STARTED,
        JobTrigger.TILE_PROGRESS,
        JobTrigger.ALL_TILES_DONE,
        JobTrigger.ALL_TILES_DONE,  # the first finalizer died; the second takes over
        JobTrigger.FINALIZED,
    ):
        job = transition_job(job, event)
    assert job is JobState.COMPLETED
