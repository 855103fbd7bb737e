"""Runs of tiny tiles (:mod:`shared.core.runs`): how long, and how released tiles are cut."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from shared.core.runs import MAX_RUN, run_length, runs


@dataclass(frozen=True)
class T:
    job_id: str
    tile_index: int
    generation: int


def test_run_length_covers_at_most_the_work() -> None:
    assert run_length(1, 64, most=16, work=4096) == 16  # 8x8 at 1 spp: capped
    assert run_length(8, 256, most=16, work=4096) == 2  # 16x16 at 8 spp
    assert run_length(1, 4096, most=16, work=4096) == 1  # 64x64 at 1 spp
    assert run_length(1, 2049, most=16, work=4096) == 1  # more than half: alone
    assert run_length(64, 4096, most=16, work=4096) == 1  # bench (a)'s tiles
    assert run_length(1, 1, most=1000, work=10**9) == MAX_RUN  # the wire bound
    assert run_length(1, 64, most=1, work=4096) == 1  # runs turned off
    assert run_length(1, 64, most=16, work=0) == 1
    assert run_length(0, 64, most=16, work=4096) == run_length(1, 0, most=16, work=4096) == 1


tiles = st.lists(
    st.builds(T, st.sampled_from(["a", "b"]), st.integers(0, 40), st.integers(0, 2)),
    unique_by=lambda t: (t.job_id, t.tile_index),
)


@given(tiles=tiles, a=st.integers(1, 8), b=st.integers(1, 8))
def test_runs_cut_released_tiles_into_consecutive_bounded_pieces(
    tiles: list[T], a: int, b: int
) -> None:
    limit = {"a": a, "b": b}
    cut = runs(tiles, limit)
    # every tile in exactly one run
    assert sorted((t.job_id, t.tile_index) for run in cut for t in run) == sorted(
        (t.job_id, t.tile_index) for t in tiles
    )
    for run in cut:
        first = run[0]
        assert 1 <= len(run) <= limit[first.job_id]
        assert [t.tile_index for t in run] == list(
            range(first.tile_index, first.tile_index + len(run))
        )
        assert {(t.job_id, t.generation) for t in run} == {(first.job_id, first.generation)}
    # a run ends early only where the next tile cannot join it
    for left, right in itertools.pairwise(cut):
        last, nxt = left[-1], right[0]
        joinable = (
            nxt.job_id == last.job_id
            and nxt.generation == last.generation
            and nxt.tile_index == last.tile_index + 1
        )
        assert not joinable or len(left) == limit[last.job_id]


def test_a_job_not_named_goes_one_tile_per_run() -> None:
    cut = runs([T("a", 0, 1), T("a", 1, 1), T("b", 0, 1)], {"b": 4})
    assert [[t.tile_index for t in run] for run in cut] == [[0], [1], [0]]
