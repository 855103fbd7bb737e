"""POV-Ray 3.7 as a Tessera renderer: one ``povray`` process per tile, one pass per tile.

POV-Ray cannot add samples to an image, so a tile is rendered in one pass (resume is per tile).
The tile is rendered as a region (``+SC/+EC/+SR/+ER``) grown by :data:`MARGIN` pixels on each
side and then cropped: adaptive anti-aliasing (method 1) compares a pixel with its neighbours, so
with the margin rendered the tile's pixels are exactly those of POV-Ray's own full-frame image.
Jitter (random per render) and radiosity (its pre-trace depends on the rendered region) cannot be
exact and are refused by :func:`check_povray_options` and :func:`check_povray_source` (in
:mod:`proto.povray`, so the client and the gateway refuse them at submit too).

The output is a 16-bit binary PPM (``+FP16``, exact integers, no dithering); the accumulator
holds ``value / 65535 * spp`` per channel, so ``sum / spp`` is POV-Ray's pixel value: the
assembled tiles equal POV-Ray's own 16-bit image pixel for pixel.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel.rect import Rect
from proto.povray import BLOCK, check_povray_options, check_povray_source
from services.worker.renderers.procs import (
    RendererCrashed,
    RendererFailed,
    RendererTimeout,
    StderrTail,
    kill_group,
    spawn,
)
from shared.core.config import worker_settings
from shared.core.errors import TerminalError
from shared.core.tiles import Accumulator

__all__ = [
    "BLOCK",
    "PovrayRenderer",
    "PovrayScene",
    "check_povray_options",
    "check_povray_source",
    "povray_version",
    "read_ppm16",
]

NAME = "povray"


def povray_version(binary: str = "povray") -> str:
    """The version ``povray --version`` states (the registry's one parser,
    :func:`services.worker.renderers.version_of`); RendererFailed when it does not run."""
    from services.worker.renderers import version_of

    version = version_of(NAME, binary)
    if version is None:
        raise RendererFailed(f"`{binary} --version` failed or printed no version", renderer=NAME)
    return version


def read_ppm16(path: Path) -> npt.NDArray[np.uint16]:
    """A binary 16-bit PPM (``P6``, maxval 65535, ``#`` comments allowed) as (h, w, 3) uint16."""
    data = path.read_bytes()
    header = re.match(
        rb"P6(?:\s|#[^\n]*\n)+(\d+)(?:\s|#[^\n]*\n)+(\d+)(?:\s|#[^\n]*\n)+(\d+)\s", data
    )
    if header is None or int(header.group(3)) != 65535:
        raise TerminalError(f"{path}: not a 16-bit binary PPM")
    w, h = int(header.group(1)), int(header.group(2))
    pixels = np.frombuffer(data, dtype=">u2", count=w * h * 3, offset=header.end())
    out: npt.NDArray[np.uint16] = pixels.reshape(h, w, 3).astype(np.uint16)
    return out


@dataclass(frozen=True)
class PovrayScene:
    """A prepared POV-Ray job: the main ``.pov`` on local disk and its checked options."""

    path: Path
    width: int
    height: int
    spp: int
    options: tuple[str, ...] = ()


def _region(rect: Rect, width: int, height: int) -> list[str]:
    """The render blocks covering ``rect`` (clamped to the frame), as 1-based inclusive options."""
    b = BLOCK
    grown = Rect(
        (rect.x0 // b) * b,
        (rect.y0 // b) * b,
        min(width, -(-rect.x1 // b) * b),
        min(height, -(-rect.y1 // b) * b),
    )
    return [f"+SC{grown.x0 + 1}", f"+EC{grown.x1}", f"+SR{grown.y0 + 1}", f"+ER{grown.y1}"]


def _povray_message(tail: str) -> str:
    lines = [ln for ln in tail.splitlines() if re.search(r"error|cannot|failed", ln, re.I)]
    return " / ".join(lines[-4:]) or "failed with no error message"


class PovrayRenderer:
    """The ``povray`` renderer: a process per tile, at most ``slots`` at a time."""

    name = NAME
    interruptible = True  # a cancelled pass kills its process group

    def __init__(
        self,
        *,
        slots: int = 1,
        binary: str = "povray",
        threads: int = 1,
        watchdog: float = 600.0,
        workdir: Path | None = None,
        version: str | None = None,
    ) -> None:
        #: as the registry found it (``create``), else asked of the binary
        self.version = version or povray_version(binary)
        self.binary = binary
        self.threads = threads
        self.watchdog = watchdog
        self.workdir = workdir
        #: POV-Ray processes at most at once
        self.processes = slots
        self._slots = asyncio.Semaphore(slots)
        self._running: set[asyncio.subprocess.Process] = set()

    async def prepare(self, job: Any, asset_dir: Path | None) -> PovrayScene:
        """The job's main ``.pov`` inside ``asset_dir`` and its options (checked again here)."""
        if asset_dir is None:
            raise TerminalError("a povray job needs its scene asset")
        options = tuple(check_povray_options(job.scene.get("options", [])))
        return PovrayScene(asset_dir / job.scene["main"], job.width, job.height, job.spp, options)

    def nbytes(self, prepared: PovrayScene) -> int:
        """Bytes the prepared scene holds in the worker: none to speak of (a path and a few
        numbers; the scene itself is on disk and in the renderer's own processes)."""
        return 0

    def passes(self, job: Any) -> tuple[int, ...]:
        """One pass of all samples: POV-Ray renders a tile once."""
        return (job.spp,)

    async def render(
        self, prepared: PovrayScene, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        """Render ``rect`` once and add ``value * (end - start)`` into ``acc``; the seconds its
        process took (not the wait for a slot)."""
        async with self._slots:
            began = time.perf_counter()
            pixels = await self._render_retrying(prepared, rect)
            seconds = time.perf_counter() - began
        acc += pixels.astype(np.float64) / 65535.0 * (end - start)
        return seconds

    async def _render_retrying(self, scene: PovrayScene, rect: Rect) -> npt.NDArray[np.uint16]:
        try:
            return await self._render_once(scene, rect)
        except RendererCrashed as exc:
            if exc.signalled:
                raise
        # A plain non-zero exit without a parse error: once may be the machine, twice the input.
        try:
            return await self._render_once(scene, rect)
        except RendererCrashed as exc:
            if exc.signalled:
                raise
            raise RendererFailed(
                f"{exc} twice on the same input", renderer=NAME, stderr_tail=exc.stderr_tail
            ) from exc

    async def _render_once(self, scene: PovrayScene, rect: Rect) -> npt.NDArray[np.uint16]:
        with tempfile.TemporaryDirectory(prefix="tessera-povray-", dir=self.workdir) as tmp:
            out = Path(tmp) / "tile.ppm"
            region = _region(rect, scene.width, scene.height)
            argv = [
                self.binary, "-D", f"+I{scene.path.name}", f"+O{out}", "+FP16",
                f"+W{scene.width}", f"+H{scene.height}", *region, "Dither=off", "-J",
                f"+WT{self.threads}", *scene.options,
            ]  # fmt: skip
            proc = await spawn(argv, cwd=scene.path.parent)
            await self._wait(proc)
            full = read_ppm16(out)
        return full[rect.y0 : rect.y1, rect.x0 : rect.x1]

    async def _wait(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        tail = StderrTail(proc.stderr)
        self._running.add(proc)
        try:
            async with asyncio.timeout(self.watchdog):
                code = await proc.wait()
        except TimeoutError:
            kill_group(proc)
            await proc.wait()
            raise RendererTimeout(
                f"tile not done within {self.watchdog:g} s; process group killed",
                renderer=NAME,
                stderr_tail=await tail.finish(),
            ) from None
        except BaseException:
            kill_group(proc)  # cancelled: lease lost, pause, stop
            await proc.wait()
            raise
        finally:
            self._running.discard(proc)
        text = await tail.finish()
        if code == 0:
            return
        if re.search(r"Parse Error|Cannot open|Fatal error in parser", text):
            raise RendererFailed(_povray_message(text), renderer=NAME, stderr_tail=text)
        raise RendererCrashed(
            f"killed by signal {-code}" if code < 0 else f"exited with code {code}",
            renderer=NAME,
            stderr_tail=text,
            signalled=code < 0,
        )

    async def kill_all(self) -> None:
        """Kill every running POV-Ray process group now."""
        for proc in list(self._running):
            kill_group(proc)

    async def close(self) -> None:
        """Kill what still runs."""
        await self.kill_all()


def create(found: Any, slots: int) -> PovrayRenderer:
    """The registry's constructor: at most ``TESSERA_POVRAY_PROCESSES`` POV-Ray processes at
    a time (default: the worker's tiles in hand, twice its ``slots`` kernel threads)."""
    worker = worker_settings(os.environ)
    processes = worker.povray_processes or worker.in_hand or 2 * slots
    return PovrayRenderer(
        slots=processes, binary=found.executable or "povray", version=found.version
    )
