"""``plan_release`` with runs (pure): the window counts messages. The first tile of each message
picked for a job takes one of its renderer's budget; the next ``run - 1`` ride along."""

from __future__ import annotations

from datetime import UTC, datetime

from shared.core.fairshare import ProjectShare, Waiting, plan_release

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _waiting(job_id: str, tiles: int, run: int = 1, priority: int = 50) -> Waiting:
    return Waiting(job_id, "p", priority, _T0, "tessera", tiles, run)


def test_a_message_of_the_window_takes_a_whole_run() -> None:
    assert plan_release([_waiting("a", 10, run=4)], {"tessera": 1}, {}, 1.0) == {"a": 4}
    assert plan_release([_waiting("a", 10, run=4)], {"tessera": 2}, {}, 1.0) == {"a": 8}
    assert plan_release([_waiting("a", 10, run=4)], {"tessera": 3}, {}, 1.0) == {"a": 10}


def test_a_job_short_of_a_run_takes_a_whole_message_and_leaves_the_rest() -> None:
    waiting = [_waiting("a", 2, run=4), _waiting("b", 5)]
    assert plan_release(waiting, {"tessera": 2}, {}, 1.0) == {"a": 2, "b": 1}
    assert plan_release(waiting, {"tessera": 1}, {}, 1.0) == {"a": 2}


def test_a_higher_priority_job_of_single_tiles_is_served_before_a_run_of_a_lower_one() -> None:
    """Whole messages leave no fraction of the window for a lower priority to take."""
    waiting = [_waiting("low", 16, run=8, priority=10), _waiting("high", 3, priority=90)]
    assert plan_release(waiting, {"tessera": 1}, {}, 1.0) == {"high": 1}
    assert plan_release(waiting, {"tessera": 4}, {}, 1.0) == {"high": 3, "low": 8}


def test_a_project_cap_counts_tiles_even_in_runs() -> None:
    projects = {"p": ProjectShare(max_in_flight=5)}
    assert plan_release([_waiting("a", 16, run=8)], {"tessera": 2}, projects, 1.0) == {"a": 5}
