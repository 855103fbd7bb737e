"""Blender Cycles as a Tessera renderer: one long-lived Blender process per kernel slot.

Each slot runs ``blender -b --factory-startup --python blender_server.py`` and feeds it one
request per pass; the server keeps the ``.blend`` loaded between passes and tiles of the same
file (Blender takes about a second to start, a small pass a few hundredths). A pass renders the
tile as a border render cropped to the border, samples ``[start, end)`` via
``cycles.sample_offset``, on the CPU with adaptive sampling and denoising off, a fixed number of
threads, into a float32 OpenEXR file; its RGB times the number of samples is added to the tile's
float64 accumulator, so ``sum / spp`` is the image. With one pass per tile the assembled image
equals Blender's own full-frame render value for value; a tile's passes are fixed at plan time
(:func:`blender_passes`), so a resumed tile equals the uninterrupted one bit for bit.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import OpenEXR

from kernel.rect import Rect
from services.worker.renderers.procs import (
    RendererCrashed,
    RendererFailed,
    RendererTimeout,
    StderrTail,
    kill_group,
    spawn,
)
from shared.core.crash import crash_point
from shared.core.errors import TerminalError
from shared.core.tiles import Accumulator

__all__ = [
    "SERVER_SCRIPT",
    "BlenderRenderer",
    "BlenderScene",
    "BlenderSlot",
    "Scratch",
    "blender_passes",
    "blender_version",
    "read_exr_rgb",
]

SERVER_SCRIPT = Path(__file__).with_name("blender_server.py")
_MARK = b"\x1etessera-blender "
NAME = "blender"
#: seconds a Blender process may take to start and answer its first request
START_TIMEOUT = 60.0


def blender_passes(spp: int, samples_per_pass: int) -> list[tuple[int, int]]:
    """A tile's sample ranges ``[start, end)``: fixed by ``spp`` and the pass size alone."""
    if spp < 1 or samples_per_pass < 1:
        raise ValueError(f"bad pass plan: spp={spp}, samples_per_pass={samples_per_pass}")
    return [(a, min(a + samples_per_pass, spp)) for a in range(0, spp, samples_per_pass)]


def blender_version(binary: str = "blender") -> str:
    """The version ``blender --version`` states (the registry's one parser,
    :func:`services.worker.renderers.version_of`); RendererFailed when it does not run."""
    from services.worker.renderers import version_of

    version = version_of(NAME, binary)
    if version is None:
        raise RendererFailed(f"`{binary} --version` failed or printed no version", renderer=NAME)
    return version


def read_exr_rgb(path: Path) -> npt.NDArray[np.float32]:
    """The RGB channels of a float32 RGBA OpenEXR file, rows top-down, shape (h, w, 3)."""
    with OpenEXR.File(str(path)) as exr:
        pixels = np.asarray(exr.channels()["RGBA"].pixels)
    if pixels.dtype != np.float32 or pixels.ndim != 3:
        raise TerminalError(f"{path}: expected float32 RGBA, got {pixels.dtype} {pixels.shape}")
    rgb: npt.NDArray[np.float32] = pixels[:, :, :3]
    return rgb


@dataclass(frozen=True)
class BlenderScene:
    """A prepared Blender job: the ``.blend`` on local disk and the frame's settings."""

    path: Path
    frame: int
    width: int
    height: int
    spp: int
    seed: int | None = None


class Scratch:
    """A renderer's scratch directory (its slots' working directory and EXR files), made on the
    first pass, not when the renderer is created: every worker with Blender installed creates a
    renderer, and one killed before close() left an empty ``tessera-blender-*`` directory
    behind (a CI run left about fifty in ``/tmp``); now only one killed after rendering Blender
    does."""

    def __init__(self, parent: Path | None = None) -> None:
        self.parent = parent
        self._path: Path | None = None

    @property
    def made(self) -> bool:
        """Whether the directory exists (was made and not yet removed)."""
        return self._path is not None

    def path(self) -> Path:
        """The directory, made now if it was not."""
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix="tessera-blender-", dir=self.parent))
        return self._path

    def remove(self) -> None:
        """Remove the directory and what is in it (a later pass makes a new one)."""
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


class BlenderSlot:
    """One Blender process and the requests it serves, one at a time; restarted when it dies."""

    def __init__(self, scratch: Scratch, *, binary: str = "blender", threads: int = 1) -> None:
        self.scratch = scratch
        self.binary = binary
        self.threads = threads
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: StderrTail | None = None
        #: the file the process has open (set after a successful pass)
        self.loaded: Path | None = None
        #: the process's ``TMPDIR``, inside the scratch directory (see :meth:`_start`)
        self.tmp: Path | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The Blender process's PID (its process group's too), or None."""
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    async def _start(self) -> None:
        # Blender makes its own temporary directory (``blender_XXXXXX``) under ``TMPDIR`` and
        # removes it only when it exits by itself: every process killed (a cancel, a pause, a
        # lost lease, a timeout, the worker's stop) left an empty one in /tmp, about fifteen a
        # CI run. Each process gets a directory of its own in the scratch directory, removed
        # when the process is gone (:meth:`_ended`), or with the scratch directory.
        self.tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=self.scratch.path()))
        # (-noaudio: no sound system; with one, every Blender start made a PulseAudio client
        # directory, /tmp/pulse-*, and left it)
        argv = [self.binary, "-b", "-noaudio", "--factory-startup", "--python", str(SERVER_SCRIPT)]
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        try:
            self.proc = await spawn(argv, cwd=self.scratch.path(), stdin=True, stdout=True, env=env)
        except BaseException:
            self._ended()
            raise
        assert self.proc.stderr is not None
        self.tail = StderrTail(self.proc.stderr)
        self.loaded = None
        await self._call({"op": "hello"}, START_TIMEOUT)

    async def _reply(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            if line.startswith(_MARK):
                reply: dict[str, Any] = json.loads(line[len(_MARK) :])
                return reply
        raise await self._died()

    async def _died(self) -> RendererCrashed | RendererFailed:
        assert self.proc is not None and self.tail is not None
        code = await self.proc.wait()
        tail = await self.tail.finish()
        self.proc = None
        self._ended()
        if code < 0:
            return RendererCrashed(
                f"killed by signal {-code}", renderer=NAME, stderr_tail=tail, signalled=True
            )
        return RendererFailed(f"exited with code {code}", renderer=NAME, stderr_tail=tail)

    async def _call(self, request: dict[str, Any], limit: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        try:
            async with asyncio.timeout(limit):
                await self.proc.stdin.drain()
                reply = await self._reply()
                if reply.get("event") == "started":
                    crash_point("worker.blender_mid_pass")
                    reply = await self._reply()
        except TimeoutError:
            await self.kill()
            raise RendererTimeout(
                f"no answer within {limit:g} s; process group killed", renderer=NAME
            ) from None
        except BaseException:
            await self.kill()  # cancelled (lease lost, pause, stop): the pass must not go on
            raise
        if not reply.get("ok"):
            tail = self.tail.text() if self.tail else ""
            raise RendererFailed(str(reply.get("message")), renderer=NAME, stderr_tail=tail)
        return reply

    async def render(
        self, scene: BlenderScene, rect: Rect | None, start: int, end: int, limit: float
    ) -> npt.NDArray[np.float32]:
        """Samples ``[start, end)`` of ``rect`` (None: the whole frame) as float32 RGB."""
        async with self._lock:
            return await self._render(scene, rect, start, end, limit)

    async def _render(
        self, scene: BlenderScene, rect: Rect | None, start: int, end: int, limit: float
    ) -> npt.NDArray[np.float32]:
        exits = 0
        while True:
            if self.proc is None:
                await self._start()
            out = self.scratch.path() / f"pass-{self.pid}.exr"
            request = {
                "op": "render",
                "file": str(scene.path),
                "frame": scene.frame,
                "width": scene.width,
                "height": scene.height,
                "rect": list(rect) if rect is not None else None,
                "start": start,
                "end": end,
                "threads": self.threads,
                "seed": scene.seed,
                "out": str(out),
            }
            try:
                await self._call(request, limit)
            except RendererFailed:
                # The process exited (no reply): once may be the machine, twice is the input.
                if self.proc is None and exits == 0:
                    exits += 1
                    continue
                raise
            self.loaded = scene.path
            try:
                return read_exr_rgb(out)
            finally:
                out.unlink(missing_ok=True)

    async def kill(self) -> None:
        """SIGKILL the process group and reap it (a later pass starts a fresh process)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            kill_group(proc)
            await proc.wait()
            if self.tail is not None:
                await self.tail.finish()
        self._ended()

    def _ended(self) -> None:
        """The process is gone: its ``TMPDIR`` goes too."""
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


class BlenderRenderer:
    """The ``blender`` renderer: ``slots`` Blender processes, each rendering one pass at a time."""

    name = NAME
    interruptible = True  # a cancelled pass kills its process group

    def __init__(
        self,
        *,
        slots: int = 1,
        binary: str = "blender",
        threads_per_slot: int = 1,
        samples_per_pass: int = 32,
        watchdog: float = 600.0,
        workdir: Path | None = None,
        version: str | None = None,
    ) -> None:
        #: as the registry found it (``create``), else asked of the binary
        self.version = version or blender_version(binary)
        self.samples_per_pass = samples_per_pass
        self.watchdog = watchdog
        # Scratch for the slots' EXR files: made on the first pass, removed by close().
        self.scratch = scratch = Scratch(workdir)
        self.slots = [BlenderSlot(scratch, binary=binary, threads=threads_per_slot)]
        self.slots += [
            BlenderSlot(scratch, binary=binary, threads=threads_per_slot) for _ in range(slots - 1)
        ]
        self._idle = asyncio.Queue[BlenderSlot]()
        for slot in self.slots:
            self._idle.put_nowait(slot)

    async def prepare(self, job: Any, asset_dir: Path | None) -> BlenderScene:
        """The job's ``.blend`` (``scene["main"]`` inside ``asset_dir``) and its settings."""
        if asset_dir is None:
            raise TerminalError("a blender job needs its scene asset")
        scene = job.scene
        return BlenderScene(
            path=asset_dir / scene["main"],
            frame=job.frame,
            width=job.width,
            height=job.height,
            spp=job.spp,
            seed=scene.get("seed"),
        )

    def nbytes(self, prepared: BlenderScene) -> int:
        """Bytes the prepared scene holds in the worker: none to speak of (a path and a few
        numbers; the scene itself is on disk and in the renderer's own processes)."""
        return 0

    def passes(self, job: Any) -> tuple[int, ...]:
        """The job's fixed pass plan (where each pass ends): :func:`blender_passes` of its spp."""
        ranges = blender_passes(
            job.spp, int(job.scene.get("samples_per_pass", self.samples_per_pass))
        )
        return tuple(end for _, end in ranges)

    async def _slot_for(self, scene: BlenderScene) -> BlenderSlot:
        slot = await self._idle.get()
        # Prefer an idle slot that already has this file open.
        for _ in range(self._idle.qsize()):
            if slot.loaded == scene.path:
                break
            self._idle.put_nowait(slot)
            slot = self._idle.get_nowait()
        return slot

    async def render(
        self, prepared: BlenderScene, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        """Add samples ``[start, end)`` of ``rect`` into ``acc`` (radiance times samples); the
        seconds its slot's process took (not the wait for a slot)."""
        slot = await self._slot_for(prepared)
        began = time.perf_counter()
        try:
            rgb = await slot.render(prepared, rect, start, end, self.watchdog)
        finally:
            self._idle.put_nowait(slot)
        seconds = time.perf_counter() - began
        if rgb.shape != acc.shape:
            raise TerminalError(f"blender returned {rgb.shape} for a {acc.shape} tile")
        acc += rgb.astype(np.float64) * (end - start)
        return seconds

    async def kill_all(self) -> None:
        """Kill every slot's process group now (lease lost, cancel, pause); they restart lazily."""
        for slot in self.slots:
            await slot.kill()

    async def close(self) -> None:
        """Kill the processes and remove the scratch directory."""
        await self.kill_all()
        self.scratch.remove()


def create(found: Any, slots: int) -> BlenderRenderer:
    """The registry's constructor: one Blender process per kernel slot, one thread each."""
    return BlenderRenderer(slots=slots, binary=found.executable or "blender", version=found.version)
