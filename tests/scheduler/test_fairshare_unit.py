"""``plan_release`` with runs (pure): a tile weighs ``1 / run`` of its renderer's window, and
is released only while its whole weight fits."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction

from shared.core.fairshare import Waiting, plan_release

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _waiting(job_id: str, tiles: int, run: int = 1) -> Waiting:
    return Waiting(job_id, "p", 50, _T0, "tessera", tiles, run)


def test_a_message_of_the_window_takes_a_whole_run() -> None:
    assert plan_release([_waiting("a", 10, run=4)], {"tessera": 1}, {}, 1.0) == {"a": 4}
    assert plan_release([_waiting("a", 10, run=4)], {"tessera": 2}, {}, 1.0) == {"a": 8}


def test_a_part_of_a_message_takes_that_part_of_a_run_and_no_tile_sent_alone() -> None:
    three_quarters = {"tessera": Fraction(3, 4)}
    assert plan_release([_waiting("a", 10, run=4)], three_quarters, {}, 1.0) == {"a": 3}
    assert plan_release([_waiting("b", 10)], three_quarters, {}, 1.0) == {}


def test_what_a_run_leaves_goes_to_the_next_job_only_in_whole_weights() -> None:
    waiting = [_waiting("a", 2, run=4), _waiting("b", 5)]
    assert plan_release(waiting, {"tessera": Fraction(3, 2)}, {}, 1.0) == {"a": 2, "b": 1}
    assert plan_release(waiting, {"tessera": Fraction(5, 4)}, {}, 1.0) == {"a": 2}
