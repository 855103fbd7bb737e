"""The finalizer's read-ahead of tile results: bounded in bytes, dropped job by job."""

from __future__ import annotations

from services.finalizer.cache import ReadAhead, Result


def test_read_ahead_is_bounded_by_whole_jobs() -> None:
    cache = ReadAhead(budget=100)
    cache.put("a", 0, Result("k0", "s0", b"x" * 40))
    cache.put("b", 0, Result("k1", "s1", b"x" * 40))
    cache.put("a", 1, Result("k2", "s2", b"x" * 10))  # touches "a": "b" is now the oldest
    cache.put("c", 0, Result("k3", "s3", b"x" * 30))  # 120 bytes: drop "b" (40)
    assert cache.bytes == 80 and not cache.has("b", 0) and cache.has("a", 1)
    cache.put("d", 0, Result("k4", "s4", b"x" * 101))  # larger than the budget: not held
    assert not cache.has("d", 0)
    assert cache.take("a") == {0: Result("k0", "s0", b"x" * 40), 1: Result("k2", "s2", b"x" * 10)}
    assert cache.bytes == 30 and cache.take("a") == {}
