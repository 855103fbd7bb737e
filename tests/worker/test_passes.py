"""How the worker sizes its sample passes and spreads them over its kernel threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import kernel
from services.worker import kernels
from services.worker.context import PassRates
from services.worker.kernels import BAND_SECONDS, INLINE_SECONDS, INLINE_WORK, KernelThreads
from services.worker.render import adaptive_end, first_pass, watchdog_bound
from services.worker.tile import pass_size
from shared.core.config import WorkerSettings
from shared.core.tiles import Accumulator, zeros_for
from tests.helpers import eventually


@pytest.fixture(scope="module")
def prepared() -> kernel.Prepared:
    settings = kernel.RenderSettings(width=48, height=40, spp=8)
    return kernel.prepare(kernel.builtin_scene("cornell"), 0, settings)


#: 33 rows of 32 pixels: bands of unequal height
RECT = kernel.Rect(8, 4, 40, 37)
#: pixel-samples of a pass of 3 samples over RECT
RECT_WORK = 32 * 33 * 3


def _four_bands(threads: KernelThreads, prepared: kernel.Prepared) -> None:
    """Make the scene's measured rate say a pass over RECT takes 3.5 bands' time: four bands."""
    threads._rates[prepared] = 3.5 * BAND_SECONDS / RECT_WORK


class _Held:
    """Stands for the kernel call: each band records itself, then waits for ``release``."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.ran: list[kernel.Rect] = []

    def __call__(self, prepared: Any, band: kernel.Rect, *rest: Any) -> float:
        self.ran.append(band)
        self.started.set()
        self.release.wait(10)
        return 0.01


@pytest.fixture
async def held_pass(
    prepared: kernel.Prepared, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[KernelThreads, _Held, asyncio.Task[float]]]:
    """A four-band pass over RECT on one kernel thread, its first band running and held."""
    held = _Held()
    monkeypatch.setattr(kernels, "_timed", held)
    threads = KernelThreads(1)
    try:
        _four_bands(threads, prepared)
        task = asyncio.create_task(threads.render(prepared, RECT, 0, 3, zeros_for(RECT)))
        assert await asyncio.to_thread(held.started.wait, 10), "the first band started"
        yield threads, held, task
    finally:
        held.release.set()
        threads.executor.shutdown()


def _alone(prepared: kernel.Prepared) -> Accumulator:
    """Samples 0..3 of RECT rendered in one call on this thread: what every split must equal."""
    acc = zeros_for(RECT)
    kernel.render_tile(prepared, RECT, 0, 3, acc)
    return acc


async def test_a_pass_split_over_idle_threads_gives_the_same_bits(
    prepared: kernel.Prepared,
) -> None:
    rect, alone = RECT, _alone(prepared)
    threads = KernelThreads(3)
    try:
        split = zeros_for(rect)
        await threads.render(prepared, rect, 0, 3, split)  # all three idle: three bands
        threads.running = 3  # every thread busy: one band, queued behind them
        whole = zeros_for(rect)
        await threads.render(prepared, rect, 0, 3, whole)
        assert threads.running == 3, "each finished call counted itself down"
    finally:
        threads.executor.shutdown()
    np.testing.assert_array_equal(split, alone)
    np.testing.assert_array_equal(whole, alone)


async def test_a_long_pass_is_split_into_bands_even_with_every_thread_busy(
    prepared: kernel.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    rect, work, alone = RECT, RECT_WORK, _alone(prepared)
    threads = KernelThreads(2)
    bands: list[kernel.Rect] = []
    submit = threads.executor.submit

    def counted(fn: Any, i: int, prepared: Any, band: kernel.Rect, *rest: Any) -> Any:
        bands.append(band)
        return submit(fn, i, prepared, band, *rest)

    monkeypatch.setattr(threads.executor, "submit", counted)
    try:
        split, rows = zeros_for(rect), zeros_for(rect)
        threads.running = 2  # every thread busy: only the predicted time splits the pass
        _four_bands(threads, prepared)  # a pass of 3.5 bands' time
        took = await threads.render(prepared, rect, 0, 3, split)
        assert took > 0, "the bands' seconds on their threads, summed"
        assert len(bands) == 4
        assert [(b.y0, b.y1) for b in bands] == [(4, 12), (12, 20), (20, 28), (28, 37)]
        assert all((b.x0, b.x1) == (8, 40) for b in bands)
        bands.clear()
        threads._rates[prepared] = 100 * BAND_SECONDS / work  # never thinner than a row
        await threads.render(prepared, rect, 0, 3, rows)
        assert [(b.y0, b.y1) for b in bands] == [(y, y + 1) for y in range(4, 37)]
        assert threads.running == 2, "each finished band counted itself down"
    finally:
        threads.executor.shutdown()
    np.testing.assert_array_equal(split, alone)
    np.testing.assert_array_equal(rows, alone)


async def test_a_pass_of_many_bands_wakes_the_loop_once(
    prepared: kernel.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    woken = list[object]()
    real = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
        woken.append(callback)
        return real(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    threads = KernelThreads(2)
    try:
        _four_bands(threads, prepared)
        await threads.render(prepared, RECT, 0, 3, zeros_for(RECT))
    finally:
        threads.executor.shutdown()
    assert len(woken) == 1, f"one call for the pass's four bands, not {len(woken)}"


async def test_a_pass_whose_threads_shut_down_under_it_is_cancelled_not_left_waiting(
    prepared: kernel.Prepared, held_pass: tuple[KernelThreads, _Held, asyncio.Task[float]]
) -> None:
    threads, held, task = held_pass
    threads.executor.shutdown(wait=False, cancel_futures=True)  # as the worker's close()
    held.release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)  # settled by its last band, not a timeout
    assert threads.running == 0
    with pytest.raises(RuntimeError):  # no thread left: nothing submitted, nothing counted
        await threads.render(prepared, RECT, 0, 3, zeros_for(RECT))
    assert threads.running == 0


async def test_a_failing_band_fails_its_pass_once_every_band_has_ended(
    prepared: kernel.Prepared, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = list[int]()

    def second_fails(prepared: Any, band: kernel.Rect, *rest: Any) -> float:
        if band.y0 == 12:
            raise ValueError("a band's kernel call failed")
        ended.append(band.y0)
        return 0.01

    monkeypatch.setattr(kernels, "_timed", second_fails)
    threads = KernelThreads(2)
    try:
        _four_bands(threads, prepared)
        with pytest.raises(ValueError, match="a band's kernel call failed"):
            await threads.render(prepared, RECT, 0, 3, zeros_for(RECT))
        assert sorted(ended) == [4, 20, 28], "the other bands ran to their end first"
        assert threads.running == 0
    finally:
        threads.executor.shutdown()


async def test_a_cancelled_pass_leaves_its_bands_not_yet_started_unrun(
    held_pass: tuple[KernelThreads, _Held, asyncio.Task[float]],
) -> None:
    # the watchdog gives up on a pass: its queued bands must not keep the thread busy
    threads, held, task = held_pass
    assert threads.running == 4
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    held.release.set()
    await asyncio.to_thread(threads.executor.shutdown)  # the running band ends
    assert len(held.ran) == 1, "the three queued bands were cancelled with the pass"
    await eventually(lambda: threads.running == 0, what="every band counted down", timeout=5)


async def test_split_calls_are_counted_while_they_run(prepared: kernel.Prepared) -> None:
    threads = KernelThreads(2)
    try:
        rect = kernel.Rect(0, 0, 48, 40)
        task = asyncio.create_task(threads.render(prepared, rect, 0, 64, zeros_for(rect)))
        await asyncio.sleep(0)  # the task submits both bands before its first wait
        assert threads.running == 2
        await task
        # each band counts itself down (on its thread) before the pass reaches the loop
        assert threads.running == 0
    finally:
        threads.executor.shutdown()


def test_pass_size_grows_to_the_target_duration_within_bounds() -> None:
    tuning = WorkerSettings(samples_per_pass=4, pass_seconds=0.5)
    assert pass_size(4, 0.01, tuning) == 64, "at most 16 times the last pass"
    assert pass_size(4, 0.1, tuning) == 20, "4 samples in 0.1 s: 20 in 0.5 s"
    assert pass_size(4, 5.0, tuning) == 4, "never below samples_per_pass"
    assert pass_size(4, 0.0, tuning) == 64
    assert pass_size(8, 0.1, WorkerSettings(samples_per_pass=4, pass_seconds=0)) == 4, "0 disables"


def test_a_pass_stays_within_half_the_watchdog_at_the_pace_it_had_on_the_loop() -> None:
    tuning = WorkerSettings(samples_per_pass=4, pass_seconds=0.5, progress_timeout=120.0)
    assert watchdog_bound(64, 4, 1.0, tuning) == 64, "4 samples in 1 s: 240 fit in 60 s"
    assert watchdog_bound(64, 16, 30.0, tuning) == 32, "16 samples waited 30 s: 32 fit in 60 s"
    assert watchdog_bound(64, 4, 200.0, tuning) == 4, "never below samples_per_pass"
    assert watchdog_bound(64, 4, 0.0, tuning) == 64


def test_a_first_pass_is_sized_from_the_jobs_measured_rate_within_bounds() -> None:
    tuning = WorkerSettings(samples_per_pass=4, pass_seconds=0.5)
    pixels = 64 * 64
    assert first_pass(None, pixels, tuning) == 4, "not measured yet: samples_per_pass"
    per_sample = 0.5 / (20 * pixels)  # 20 samples of the tile take 0.5 s
    assert first_pass(per_sample, pixels, tuning) == 20
    assert first_pass(per_sample / 1000, pixels, tuning) == 64, "at most 16 times the floor"
    assert first_pass(per_sample * 1000, pixels, tuning) == 4, "never below samples_per_pass"
    fixed = WorkerSettings(samples_per_pass=4, pass_seconds=0)
    assert first_pass(per_sample, pixels, fixed) == 4, "pass_seconds 0: every pass is the floor"


def test_a_pass_that_would_leave_a_sliver_takes_it_along() -> None:
    tuning = WorkerSettings(samples_per_pass=4, pass_seconds=0.5)
    assert adaptive_end(4, 58, 64, tuning) == 64, "2 left of a pass of 58: one pass"
    assert adaptive_end(0, 4, 8, tuning) == 4, "4 left of a pass of 4: a pass of their own"
    assert adaptive_end(0, 40, 64, tuning) == 40
    assert adaptive_end(60, 16, 64, tuning) == 64, "never past spp"
    fixed = WorkerSettings(samples_per_pass=4, pass_seconds=0)
    assert adaptive_end(4, 58, 64, fixed) == 62, "pass_seconds 0: passes of exactly their size"


def test_pass_rates_keep_each_jobs_last_measure_for_a_bounded_number_of_jobs() -> None:
    rates = PassRates(size=2)
    rates.record("a", 0.0, 100)  # nothing measured (an inline pass too fast for the clock)
    assert rates.get("a") is None
    rates.record("a", 2.0, 100)
    rates.record("a", 1.0, 100)
    assert rates.get("a") == 0.02, "the slowest pass's rate, not the last"
    rates.record("b", 1.0, 10)
    rates.record("c", 1.0, 10)
    assert rates.get("a") is None and rates.get("b") == 0.1 and rates.get("c") == 0.1


async def test_a_tiny_pass_runs_inline_once_its_scene_is_measured_with_the_same_bits(
    prepared: kernel.Prepared,
) -> None:
    rect = kernel.Rect(0, 0, 8, 8)
    alone = zeros_for(rect)
    kernel.render_tile(prepared, rect, 0, 1, alone)
    threads = KernelThreads(2)
    try:
        first, second = zeros_for(rect), zeros_for(rect)
        await threads.render(prepared, rect, 0, 1, first)  # not yet measured: on the threads
        assert threads.inline_passes == 0
        measured = threads._rates.get(prepared)
        assert measured is not None and measured > 0, "the pass measured its scene"
        # 64 paths take about 0.2 ms; set the rate so a loaded machine's slow first pass
        # (a preempted thread) cannot make the decision flaky
        threads._rates[prepared] = INLINE_SECONDS / INLINE_WORK
        await threads.render(prepared, rect, 0, 1, second)
        assert threads.inline_passes == 1
        big = kernel.Rect(0, 0, 48, 40)  # more than INLINE_WORK pixel-samples: never inline
        threads._rates[prepared] = INLINE_SECONDS / INLINE_WORK
        await threads.render(prepared, big, 0, 4, zeros_for(big))
        assert threads.inline_passes == 1
    finally:
        threads.executor.shutdown()
    np.testing.assert_array_equal(first, alone)
    np.testing.assert_array_equal(second, alone)
