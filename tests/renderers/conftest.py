"""Fixtures for the renderer tests: the real ``blender`` and ``povray``, never skipped.

A missing binary fails the test with the way to get it (``make test`` installs both). One
Blender renderer (one long-lived process) serves a whole test module, since a Blender start
costs about a second.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from services.cli.demo_scenes import build_demo_blend
from services.worker.renderers.blender import BlenderRenderer

ROOT = Path(__file__).resolve().parents[2]
SCENES = Path(__file__).with_name("scenes")


def require(binary: str) -> str:
    """The path of ``binary``, or fail the test saying how to install it."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(
            f"`{binary}` is not on PATH: `make test` installs it "
            "(apt-get install -y blender povray chromium)",
            pytrace=False,
        )
    return path


def group_members(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes in process group ``pgid``."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


@pytest.fixture(scope="session")
def demo_blend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's demo scene, built by Blender's Python (no .blend is checked in)."""
    require("blender")
    return build_demo_blend(tmp_path_factory.mktemp("blend") / "demo.blend")


@pytest.fixture(scope="module")
async def blender() -> AsyncIterator[BlenderRenderer]:
    """One Blender renderer (one slot, one thread) for the module; closed at the end."""
    require("blender")
    renderer = BlenderRenderer(slots=1, watchdog=120.0)
    try:
        yield renderer
    finally:
        await renderer.close()


@pytest.fixture()
def pov_scene(tmp_path: Path) -> Path:
    """A copy of the test .pov scene and its include file."""
    require("povray")
    for src in SCENES.iterdir():
        shutil.copy(src, tmp_path / src.name)
    return tmp_path / "scene.pov"
