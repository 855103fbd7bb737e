"""When a worker tells the dispatchers it has room (:class:`services.worker.room.RoomCount`)."""

from __future__ import annotations

from services.worker.room import RoomCount


def test_long_tiles_a_room_once_the_spare_tiles_are_done() -> None:
    """2 threads, 4 in hand, no tile waiting in the stream: the first tile done leaves 3 in
    hand (every thread still has one), the second leaves 2: both are told then, in one."""
    count = RoomCount(threads=2, in_hand=4)
    assert count.every == 2
    assert count.left(1, held=3) == 0
    assert count.left(1, held=2) == 2
    assert count.left(1, held=3) == 0, "counting again from zero"


def test_a_worker_that_refills_from_the_stream_tells_every_spare_tiles() -> None:
    """Short tiles with a buffer: each tile that leaves is replaced from the stream, so the
    worker never gets down to its threads; it tells every 2 tiles all the same."""
    count = RoomCount(threads=2, in_hand=4)
    sent = [count.left(1, held=3) for _ in range(7)]
    assert sent == [0, 2, 0, 2, 0, 2, 0]
    assert count.pending == 1


def test_down_to_its_threads_a_worker_tells_each_tile() -> None:
    """The end of a job, nothing more to fetch: a worker holding no more tiles than threads
    tells each tile at once (one of its threads is about to wait for a release)."""
    count = RoomCount(threads=4, in_hand=8)
    assert count.left(1, held=5) == 0
    assert count.left(1, held=4) == 2
    assert [count.left(1, held=h) for h in (3, 2, 1, 0)] == [1, 1, 1, 1]


def test_a_run_is_all_its_tiles_and_a_tight_worker_tells_each() -> None:
    count = RoomCount(threads=2, in_hand=4)
    assert count.left(16, held=12) == 16, "a run of 16 tiny tiles is more than the spare"
    tight = RoomCount(threads=2, in_hand=2)  # holds no more than it renders
    assert tight.every == 1
    assert tight.left(1, held=1) == 1
    assert tight.left(0, held=1) == 1, "an undecodable message still left the hand"
