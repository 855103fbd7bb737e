"""Blender Cycles through the renderer: exact tiles, exact resume, failures classified."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernel.rect import Rect
from services.worker.renderers.blender import (
    BlenderRenderer,
    BlenderScene,
    blender_passes,
    blender_version,
    read_exr_rgb,
)
from services.worker.renderers.procs import RendererCrashed, RendererFailed, RendererTimeout
from shared.core.errors import RetryableError, TerminalError
from shared.core.tiles import assemble, from_npy, plan_rects, to_npy, zeros_for
from tests.helpers import eventually
from tests.renderers.conftest import group_members, require

W, H, SPP, FRAME = 64, 48, 16, 12

# Blender's own settings for the reference frame, written out here rather than taken from the
# server script, so the test checks the server against Blender and not against itself.
REFERENCE = """
import bpy
s = bpy.context.scene
s.render.engine = 'CYCLES'
s.cycles.device = 'CPU'
s.cycles.use_adaptive_sampling = False
s.cycles.use_denoising = False
s.cycles.samples = {spp}
s.render.resolution_x, s.render.resolution_y, s.render.resolution_percentage = {w}, {h}, 100
s.render.threads_mode = 'FIXED'
s.render.threads = 1
s.render.use_border = False
f = s.render.image_settings
f.file_format, f.color_depth, f.color_mode = 'OPEN_EXR', '32', 'RGBA'
"""


def blender_full_frame(blend: Path, out_dir: Path) -> np.ndarray:
    """``blender -b file -f FRAME``: Blender's own render of the whole frame, float32 RGB."""
    script = REFERENCE.format(spp=SPP, w=W, h=H)
    argv = [require("blender"), "-b", "-noaudio", str(blend), "--python-expr", script]
    argv += ["-o", str(out_dir / "ref_####"), "-F", "OPEN_EXR", "-f", str(FRAME)]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return read_exr_rgb(out_dir / f"ref_{FRAME:04d}.exr")


def scene(blend: Path) -> BlenderScene:
    return BlenderScene(path=blend, frame=FRAME, width=W, height=H, spp=SPP)


def test_pass_plan_is_fixed() -> None:
    assert blender_passes(16, 8) == [(0, 8), (8, 16)]
    assert blender_passes(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert blender_passes(5, 32) == [(0, 5)]
    with pytest.raises(ValueError):
        blender_passes(0, 4)


def test_version_from_blender() -> None:
    require("blender")
    assert blender_version().startswith("3.")


@pytest.mark.parametrize("tile", [16, 32])
async def test_tiles_equal_blenders_full_frame(
    blender: BlenderRenderer, demo_blend: Path, tmp_path: Path, tile: int
) -> None:
    reference = blender_full_frame(demo_blend, tmp_path)
    parts = []
    for rect in plan_rects(W, H, tile):
        acc = zeros_for(rect)
        await blender.render(scene(demo_blend), rect, 0, SPP, acc)
        parts.append((rect, acc))
    image = assemble(W, H, parts) / SPP
    assert reference.shape == (H, W, 3)
    assert np.array_equal(image, reference.astype(np.float64)), np.abs(image - reference).max()


async def test_resume_after_kill_equals_uninterrupted(
    blender: BlenderRenderer, demo_blend: Path
) -> None:
    rect = Rect(16, 16, 48, 40)
    plan = blender_passes(SPP, 8)
    straight = zeros_for(rect)
    for start, end in plan:
        await blender.render(scene(demo_blend), rect, start, end, straight)

    first = zeros_for(rect)
    await blender.render(scene(demo_blend), rect, *plan[0], first)
    checkpoint = to_npy(first)
    pid = blender.slots[0].pid
    assert pid is not None
    await blender.kill_all()  # the lease is lost: the process group goes
    assert group_members(pid) == []
    resumed = from_npy(checkpoint, rect)
    await blender.render(scene(demo_blend), rect, *plan[1], resumed)
    assert blender.slots[0].pid not in (None, pid)  # a fresh Blender rendered pass 2
    assert to_npy(resumed) == to_npy(straight)


async def test_one_and_two_threads_equal(blender: BlenderRenderer, demo_blend: Path) -> None:
    rect = Rect(0, 16, 32, 48)
    one = zeros_for(rect)
    await blender.render(scene(demo_blend), rect, 0, SPP, one)
    two_threads = BlenderRenderer(slots=1, threads_per_slot=2, watchdog=120.0)
    try:
        two = zeros_for(rect)
        await two_threads.render(scene(demo_blend), rect, 0, SPP, two)
    finally:
        await two_threads.close()
    assert np.array_equal(one, two)


async def test_broken_blend_is_terminal_with_blenders_message(
    blender: BlenderRenderer, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.blend"
    broken.write_bytes(b"BLENDER-v304 this is not a blend file" * 10)
    bad = BlenderScene(path=broken, frame=1, width=W, height=H, spp=4)
    with pytest.raises(RendererFailed) as caught:
        await blender.render(bad, Rect(0, 0, 16, 16), 0, 4, zeros_for(Rect(0, 0, 16, 16)))
    assert isinstance(caught.value, TerminalError)
    assert "Failed to read blend file" in str(caught.value)  # Blender's own words
    assert "broken.blend" in caught.value.stderr_tail
    assert len(caught.value.stderr_tail) <= 4096


async def test_killed_blender_is_retryable_and_restarted(
    blender: BlenderRenderer, demo_blend: Path
) -> None:
    rect = Rect(0, 0, W, H)
    long = BlenderScene(path=demo_blend, frame=1, width=W, height=H, spp=1_000_000)
    task = asyncio.ensure_future(blender.render(long, rect, 0, 1_000_000, zeros_for(rect)))
    pid = await eventually(lambda: blender.slots[0].pid, what="blender started")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RendererCrashed) as caught:
        await task
    assert isinstance(caught.value, RetryableError) and caught.value.signalled
    again = zeros_for(Rect(0, 0, 8, 8))
    await blender.render(scene(demo_blend), Rect(0, 0, 8, 8), 0, 2, again)
    assert again.any()


async def test_watchdog_kills_the_process_group(demo_blend: Path) -> None:
    require("blender")
    renderer = BlenderRenderer(slots=1, watchdog=3.0)
    try:
        rect = Rect(0, 0, W, H)
        long = BlenderScene(path=demo_blend, frame=1, width=W, height=H, spp=1_000_000)
        task = asyncio.ensure_future(renderer.render(long, rect, 0, 1_000_000, zeros_for(rect)))
        pid = await eventually(lambda: renderer.slots[0].pid, what="blender started")
        tmp = renderer.slots[0].tmp
        assert tmp is not None and tmp.exists()
        with pytest.raises(RendererTimeout):
            await task
        assert group_members(pid) == []
        assert renderer.slots[0].tmp is None and not tmp.exists()  # the process's TMPDIR went
    finally:
        await renderer.close()


async def test_the_scratch_directory_is_made_on_the_first_pass_and_removed_by_close(
    demo_blend: Path, tmp_path: Path
) -> None:
    """A renderer that never renders leaves no directory, even if its worker is killed before
    close() (every worker with Blender installed creates one); one that rendered removes its
    directory on close()."""
    require("blender")
    idle = BlenderRenderer(slots=2, watchdog=120.0, workdir=tmp_path)
    assert _entries(tmp_path) == [] and not idle.scratch.made
    await idle.close()
    renderer = BlenderRenderer(slots=1, watchdog=120.0, workdir=tmp_path)
    try:
        rect = Rect(0, 0, 16, 16)
        await renderer.render(scene(demo_blend), rect, 0, 4, zeros_for(rect))
        made = _entries(tmp_path)
        assert [name.startswith("tessera-blender-") for name in made] == [True]
        # the pass's EXR read and removed; the live process's TMPDIR is all that is left
        assert _entries(tmp_path / made[0]) == [renderer.slots[0].tmp.name]  # type: ignore[union-attr]
    finally:
        await renderer.close()
    assert _entries(tmp_path) == []


async def test_a_killed_blender_leaves_no_temporary_directory(
    demo_blend: Path, tmp_path: Path
) -> None:
    """Blender makes ``blender_XXXXXX`` under its ``TMPDIR`` and removes it only when it exits by
    itself. Each process's ``TMPDIR`` is a directory of its own in the scratch directory, and
    goes with the process: killed (a cancel, a pause, a lost lease), nothing of it is left, in
    the scratch directory or in the machine's /tmp (the watchdog's kill: the test above)."""
    require("blender")
    renderer = BlenderRenderer(slots=1, watchdog=120.0, workdir=tmp_path)
    slot = renderer.slots[0]
    try:
        rect = Rect(0, 0, 16, 16)
        await renderer.render(scene(demo_blend), rect, 0, 2, zeros_for(rect))
        first = slot.tmp
        assert first is not None and first.parent == renderer.scratch.path()
        assert [name.startswith("blender_") for name in _entries(first)] == [True]
        await renderer.kill_all()  # what a cancel or a lost lease does
        assert slot.tmp is None and not first.exists()
        assert _entries(renderer.scratch.path()) == []
        await renderer.render(scene(demo_blend), rect, 2, 4, zeros_for(rect))
        assert slot.tmp is not None and slot.tmp != first  # a fresh process, a fresh TMPDIR
    finally:
        await renderer.close()
    assert _entries(tmp_path) == []


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())
