"""The dispatch window rule (:mod:`shared.core.window`), a pure function: the buffer grows with
the round latency and shrinks with the tile duration, bounded by the max factor; long tiles and
unmeasured ones get none."""

from __future__ import annotations

import pytest

from shared.core.window import HEADROOM, Ewma, Window, refill_after, window
from shared.nats.presence import WorkerInfo, spare


def _w(
    threads: int,
    tile: float | None,
    gap: float | None,
    max_factor: float = 8.0,
    spare: int = 0,
) -> Window:
    return window(threads, factor=2.0, max_factor=max_factor, tile_seconds=tile,
                  gap_seconds=gap, spare=spare)  # fmt: skip


def test_no_buffer_before_anything_is_measured() -> None:
    assert _w(32, None, 0.02) == Window(64, 0, 1, measured=False)
    assert _w(32, 0.1, None) == Window(64, 0, 1, measured=True)
    assert _w(32, 0.0, 0.02) == Window(64, 0, 1, measured=False)


def test_short_tiles_get_two_refills_of_headroom() -> None:
    """64 tiles in hand taking 0.16 s each: 400 tiles/s; a round answers in 20 ms, so the
    workers finish HEADROOM x 8 = 16 tiles in two rounds' latency: buffer 32, refill 16."""
    got = _w(32, 0.16, 0.02)
    ahead = int(HEADROOM * 0.02 * 64 / 0.16)
    assert ahead == 16
    assert got == Window(64, 2 * ahead, ahead, measured=True)
    assert got.capacity == 96


def test_long_tiles_get_none() -> None:
    """4 tiles in hand of 1.4 s, a round of 50 ms: not one tile finishes in two rounds."""
    assert _w(2, 1.4, 0.05) == Window(4, 0, 1, measured=True)
    assert _w(2, 60.0, 0.05).capacity == 4


@pytest.mark.parametrize(
    ("tile", "gap"), [(0.16, 0.01), (0.16, 0.02), (0.08, 0.02), (0.04, 0.02), (0.16, 0.05)]
)
def test_the_buffer_grows_with_the_gap_and_shrinks_with_the_tile(tile: float, gap: float) -> None:
    got = _w(32, tile, gap, max_factor=1000.0)
    assert got.buffer == 2 * int(HEADROOM * gap * 64 / tile)
    assert _w(32, tile, 2 * gap, max_factor=1000.0).buffer >= got.buffer
    assert _w(32, 2 * tile, gap, max_factor=1000.0).buffer <= got.buffer


def test_long_tiles_wait_for_the_workers_spare_tiles() -> None:
    """Workers holding 2 tiles per thread: a round is due once the fewest spare tiles of a
    worker have finished (each thread still has one), not after every tile; never more than
    the base holds beyond one per thread, never below 1, and unmeasured tiles keep 1."""
    assert _w(2, 1.4, 0.05, spare=2) == Window(4, 0, 2, measured=True)
    assert _w(2, 1.4, None, spare=2) == Window(4, 0, 2, measured=True), "no gap measured yet"
    assert _w(2, 1.4, 0.05, spare=9).refill == 2, "the base bounds what the workers hold"
    assert _w(2, 1.4, 0.05, spare=0).refill == 1, "workers with nothing in hand to spare"
    assert _w(2, None, 0.05, spare=2).refill == 1
    assert _w(0, 1.4, 0.05, spare=2).refill == 1, "no threads"
    # a buffer's half wins when it is larger; the spare tiles when they are
    assert _w(32, 0.16, 0.02, spare=4).refill == 16
    assert _w(32, 0.16, 0.002, spare=4) == Window(64, 2, 4, measured=True)


def _worker(node: str, threads: int, in_hand: int, *renderers: str) -> WorkerInfo:
    return WorkerInfo(node, threads, in_hand, dict.fromkeys(renderers, "v"), "t", 0.0)


def test_spare_is_the_fewest_tiles_a_worker_holds_beyond_its_threads() -> None:
    live = [
        _worker("a", 8, 16, "tessera"),
        _worker("b", 2, 4, "tessera", "blender"),
        _worker("c", 4, 4, "povray"),
        _worker("d", 2, 64, "blender"),
    ]
    assert spare(live, 2.0) == {"tessera": 2, "blender": 2, "povray": 0}
    assert spare(live, 1.0) == {"tessera": 0, "blender": 0, "povray": 0}, "the window's base"
    assert spare(live, 4.0) == {"tessera": 2, "blender": 2, "povray": 0}, "what it asks for"
    assert spare([], 2.0) == {}


def test_the_max_factor_bounds_the_window() -> None:
    got = _w(32, 0.001, 0.05)
    assert got == Window(64, 8 * 32 - 64, (8 * 32 - 64) // 2, measured=True)
    assert _w(32, 0.001, 0.05, max_factor=2.0) == Window(64, 0, 1, measured=True)
    assert _w(32, 0.001, 0.05, max_factor=1.0).capacity == 64, "never below the base"
    assert _w(32, 1e-300, 1e300).buffer == 8 * 32 - 64, "an overflowing ratio is the bound"


def test_no_threads_no_window() -> None:
    assert _w(0, 0.001, 0.05) == Window(0, 0, 1, measured=True)


def test_the_refill_is_the_smallest_of_the_measured_renderers() -> None:
    short, long, unmeasured = _w(32, 0.16, 0.02), _w(2, 60.0, 0.02), _w(8, None, 0.02)
    assert refill_after([short, unmeasured]) == 16, "a renderer with no recent tile: no say"
    assert refill_after([short, long]) == 1, "a long-tile renderer keeps a round per tile"
    assert refill_after([]) == 1
    assert refill_after([unmeasured]) == 1


def test_the_ewma_starts_at_its_first_sample() -> None:
    avg = Ewma(alpha=0.5)
    assert avg.value is None
    assert avg.add(0.02) == 0.02
    assert avg.add(0.04) == pytest.approx(0.03)
