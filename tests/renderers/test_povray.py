"""POV-Ray through the renderer: tiles equal the full frame, inexact settings refused."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kernel.rect import Rect
from services.worker.renderers.povray import (
    PovrayRenderer,
    PovrayScene,
    check_povray_options,
    check_povray_source,
    povray_version,
    read_ppm16,
)
from services.worker.renderers.procs import RendererCrashed, RendererFailed, RendererTimeout
from shared.core.errors import RetryableError, TerminalError, ValidationError
from shared.core.tiles import assemble, plan_rects, zeros_for
from tests.helpers import eventually
from tests.renderers.conftest import group_members, require
from tests.renderers.test_no_orphans import ENDLESS_POV

W, H = 80, 60
AA = ("+A0.1", "+R3")


def povray_full_frame(scene: Path, options: tuple[str, ...]) -> np.ndarray:
    """``povray scene.pov``: POV-Ray's own 16-bit render of the whole frame."""
    out = scene.with_name("reference.ppm")
    argv = [require("povray"), "-D", f"+I{scene.name}", f"+O{out}", "+FP16", f"+W{W}", f"+H{H}"]
    # POV-Ray jitters anti-aliasing by default; Tessera renders (and compares) with -J.
    subprocess.run([*argv, "-J", *options], cwd=scene.parent, check=True, capture_output=True)
    return read_ppm16(out)


@pytest.mark.parametrize("options", [(), AA], ids=["no-aa", "aa"])
@pytest.mark.parametrize("tile", [24, 32])
async def test_tiles_equal_povrays_full_frame(
    pov_scene: Path, options: tuple[str, ...], tile: int
) -> None:
    reference = povray_full_frame(pov_scene, options)
    spp = 3  # not a power of two: the division by spp is not exact, the rounding back is
    renderer = PovrayRenderer(slots=2)
    scene = PovrayScene(pov_scene, W, H, spp, tuple(check_povray_options(options)))
    rects = plan_rects(W, H, tile)
    accs = [zeros_for(rect) for rect in rects]
    await asyncio.gather(
        *(renderer.render(scene, r, 0, spp, a) for r, a in zip(rects, accs, strict=True))
    )
    image = assemble(W, H, list(zip(rects, accs, strict=True))) / spp
    assert np.array_equal(np.rint(image * 65535).astype(np.uint16), reference)
    assert np.abs(image - reference / 65535).max() < 1e-15


def test_version_from_povray() -> None:
    require("povray")
    assert povray_version().startswith("3.7")


@pytest.mark.parametrize("option", ["+J", "+J0.5", "Jitter=on", "jitter=true"])
def test_jitter_refused(option: str) -> None:
    with pytest.raises(ValidationError, match="jitter"):
        check_povray_options(["+A0.1", option])


@pytest.mark.parametrize("option", ["+W100", "+O/tmp/x.png", "+SC10", "+AM2", "+WT4", "+UA"])
def test_options_tessera_owns_or_inexact_refused(option: str) -> None:
    with pytest.raises(ValidationError, match="refused"):
        check_povray_options([option])


def test_exact_options_accepted() -> None:
    options = ["+A0.1", "+R3", "+AM1", "-J", "+Q9", "+K0.5", "-A", "Declare=Size=2"]
    assert check_povray_options(options) == options


def test_source_with_area_light_jitter_or_radiosity_refused() -> None:
    light = "light_source { <0,5,0> 1 area_light x, z, 4, 4 adaptive 1 jitter }"
    with pytest.raises(ValidationError, match="line 2"):
        check_povray_source(f"// a lamp\n{light}\n", "lamp.inc")
    with pytest.raises(ValidationError, match="radiosity"):
        check_povray_source("global_settings { radiosity { count 100 } }", "scene.pov")
    check_povray_source('// no jitter here\n#debug "radiosity"\nsphere { 0, 1 }', "ok.pov")


async def test_broken_pov_is_terminal_with_povrays_message(pov_scene: Path) -> None:
    broken = pov_scene.with_name("broken.pov")
    broken.write_text("sphere { <0, 0, 0> 1 pigment { rgb 1 }\ncamera { oops }\n")
    renderer = PovrayRenderer()
    rect = Rect(0, 0, 16, 16)
    with pytest.raises(RendererFailed) as caught:
        await renderer.render(PovrayScene(broken, W, H, 1), rect, 0, 1, zeros_for(rect))
    assert isinstance(caught.value, TerminalError)
    assert "Parse Error" in str(caught.value)
    assert "broken.pov" in caught.value.stderr_tail and len(caught.value.stderr_tail) <= 4096


async def test_killed_povray_is_retryable(tmp_path: Path) -> None:
    require("povray")
    endless = tmp_path / "endless.pov"
    endless.write_text(ENDLESS_POV)
    renderer = PovrayRenderer()
    rect = Rect(0, 0, 16, 16)
    task = asyncio.ensure_future(
        renderer.render(PovrayScene(endless, W, H, 1), rect, 0, 1, zeros_for(rect))
    )
    proc = await eventually(lambda: next(iter(renderer._running), None), what="povray started")
    os.kill(proc.pid, signal.SIGKILL)
    with pytest.raises(RendererCrashed) as caught:
        await task
    assert isinstance(caught.value, RetryableError) and caught.value.signalled


async def test_watchdog_kills_povrays_process_group(tmp_path: Path) -> None:
    require("povray")
    endless = tmp_path / "endless.pov"
    endless.write_text(ENDLESS_POV)
    renderer = PovrayRenderer(watchdog=2.0)
    rect = Rect(0, 0, 16, 16)
    task = asyncio.ensure_future(
        renderer.render(PovrayScene(endless, W, H, 1), rect, 0, 1, zeros_for(rect))
    )
    proc = await eventually(lambda: next(iter(renderer._running), None), what="povray started")
    with pytest.raises(RendererTimeout):
        await task
    assert group_members(proc.pid) == []


async def test_cancel_kills_povray(tmp_path: Path) -> None:
    require("povray")
    endless = tmp_path / "endless.pov"
    endless.write_text(ENDLESS_POV)
    renderer = PovrayRenderer()
    rect = Rect(0, 0, 16, 16)
    task = asyncio.ensure_future(
        renderer.render(PovrayScene(endless, W, H, 1), rect, 0, 1, zeros_for(rect))
    )
    proc = await eventually(lambda: next(iter(renderer._running), None), what="povray started")
    task.cancel()  # the lease was lost
    with pytest.raises(asyncio.CancelledError):
        await task
    assert group_members(proc.pid) == []
