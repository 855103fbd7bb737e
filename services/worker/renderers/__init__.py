"""The renderer interface, the registry of renderers by name, and discovery on ``PATH``.

A job's ``renderer`` column names the :class:`Renderer` that renders its tiles: ``tessera`` (the
numba kernel, :mod:`services.worker.renderers.tessera`), ``blender`` (Cycles,
:mod:`services.worker.renderers.blender`) or ``povray`` (:mod:`services.worker.renderers.povray`).
The worker's render loop (:mod:`services.worker.render`) is renderer-agnostic: it asks the
renderer for the job's pass plan, runs the passes one after the other into the tile's float64
accumulator, and between passes checks the lease, the drain and the cancel flag, writes
checkpoints and runs the watchdog; a renderer only renders.

The interface (exact signatures; ``Prepared`` is the renderer's own, opaque to the worker)::

    class Renderer(Protocol):
        name: str        # the registry name: "tessera", "blender", "povray"
        version: str     # the renderer's own version ("1.0.0", "3.4.1", "3.7.0.10"): part of
                         # every checkpoint's hash, so a checkpoint made by another version of
                         # the renderer is never resumed
        interruptible: bool  # a pass may be cancelled mid-way (a child process, killed):
                             # the render loop then races it against the stop signals

        async def prepare(self, job: Job, asset_dir: pathlib.Path | None) -> Prepared
        async def render(self, prepared: Prepared, rect: Rect, start: int, end: int,
                         acc: Accumulator) -> float
        def passes(self, job: Job) -> PassPlan | None
        def nbytes(self, prepared: Prepared) -> int
        async def close(self) -> None

``prepare(job, asset_dir)``
    Load the job's scene once. ``asset_dir`` is the directory the scene asset was materialised
    in (:meth:`services.worker.assets.AssetCache.materialize` of ``job.scene["asset"]``), with
    ``job.scene["main"]`` relative to it; ``None`` for ``tessera`` (its scene is inline in
    ``job.scene``). The worker caches the result per (renderer, job) in its
    :class:`~services.worker.scenes.SceneCache` (LRU bounded by count and by
    :meth:`nbytes`), so tiles of one job arriving together share one preparation. Must not block
    the event loop (run CPU work or a process start off it).
``render(prepared, rect, start, end, acc)``
    Add samples ``[start, end)`` of every pixel of ``rect`` (half-open ``(x0, y0, x1, y1)``,
    image pixels, row 0 at the top) to ``acc``: float64 of shape ``(y1-y0, x1-x0, 3)``, summed
    linear radiance (not the average: a pass of ``n`` samples adds ``n`` times its mean), the
    layout of :data:`shared.core.tiles.Accumulator`. The result must depend only on the job's
    inputs and the sample range, never on timing, threads or which worker renders, so a resumed
    tile is bit-identical to an uninterrupted one. Returns the seconds the pass took on the
    renderer's threads or process, summed — one core's time, not the wait for a free slot: the
    attempt records the sum over its passes (``render_seconds``), which is what the cost of a
    pixel-sample is measured on (``tile_size: "auto"``). The call may be cancelled (the watchdog's
    ``progress_timeout``, the worker going away): a renderer with a child process then kills it
    (its whole process group) before the cancellation propagates; ``acc`` is discarded then.
``interruptible``
    True if cancelling :meth:`render` stops the pass at once (Blender, POV-Ray: the process group
    is killed). The render loop then races each pass against the lease's loss, the worker's
    drain and the job's cancel/pause/failure, and discards a pass it cancelled (it renders into
    a scratch accumulator added to the tile's on completion). False for the numba kernel: its
    threads cannot be stopped, so its passes are awaited directly and checked between.
``passes(job)``
    The pass plan, or ``None`` to let the render loop size passes adaptively (the numba kernel:
    ``TESSERA_SAMPLES_PER_PASS`` first, then about ``TESSERA_PASS_SECONDS`` each). A plan is
    the increasing tuple of sample counts at which passes end, the last being ``job.spp``
    (``(32, 64, 96, 128)``: four passes of 32 samples). It must be a function of the job alone
    (fixed at plan time): Blender's split render is deterministic for a fixed plan but not
    equal to an unsplit one, so a resumed tile must split exactly as the first attempt did; a
    checkpoint that does not end on a boundary of the plan is not resumed. POV-Ray cannot add
    samples: its plan is ``(job.spp,)``, one pass per tile.
``nbytes(prepared)``
    Bytes the prepared scene holds in this process (for the scene cache's byte bound).
``close()``
    Release what the renderer holds (kill child processes, shut its threads down); called once
    when the worker stops.

Failures: raise a :class:`~shared.core.errors.TerminalError` subclass for a failure that recurs
on the same input (a scene the renderer cannot parse: dead letter) and a
:class:`~shared.core.errors.RetryableError` subclass for one that may not (a crash by signal, a
timeout). Anything else is a bug (the message comes back after ``ack_wait``).

Registry and discovery: a renderer module ``services.worker.renderers.<name>`` exposes
``def create(found: Found, slots: int) -> Renderer`` (``slots``: the worker's kernel threads, e.g.
one Blender process per slot). :func:`discover` finds the renderers a worker can run:
``tessera`` always; ``blender`` and ``povray`` if their executable is on ``PATH`` and answers
``--version``. ``TESSERA_RENDERERS`` (``auto``, or a comma-separated list such as
``tessera,povray``) limits them; a listed renderer that is not found is an error at start.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import pathlib
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kernel.rect import Rect
from proto import names as n
from shared.core.errors import ConfigError
from shared.core.tiles import Accumulator
from shared.metadata import Job

__all__ = [
    "NAMES",
    "TESSERA",
    "Found",
    "PassPlan",
    "Renderer",
    "available_renderers",
    "check_plan",
    "create",
    "discover",
    "version_of",
]

TESSERA = n.RENDERER_TESSERA
"""The numba kernel's renderer name (``jobs.renderer``'s default)."""

NAMES = n.RENDERERS
"""Every renderer Tessera knows, in the order they are listed."""

PassPlan = tuple[int, ...]
"""Sample counts at which a tile's passes end, increasing, the last the job's spp."""


class Renderer(Protocol):
    """Renders sample ranges of tiles of one kind of scene (see the module docstring)."""

    name: str
    version: str
    interruptible: bool

    async def prepare(self, job: Job, asset_dir: pathlib.Path | None) -> Any:
        """The job's scene, loaded once (cached by the worker per renderer and job)."""

    async def render(
        self, prepared: Any, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        """Add samples ``[start, end)`` of ``rect`` to ``acc`` (float64 ``(rows, cols, 3)``);
        the seconds of one core it took."""

    def passes(self, job: Job) -> PassPlan | None:
        """The fixed pass plan of ``job``'s tiles, or ``None`` for adaptive passes."""

    def nbytes(self, prepared: Any) -> int:
        """Bytes ``prepared`` holds (the scene cache's bound)."""

    async def close(self) -> None:
        """Release processes and threads; called once when the worker stops."""


def check_plan(plan: PassPlan, spp: int) -> PassPlan:
    """``plan`` if it is increasing, positive and ends at ``spp``; else :class:`ValueError`."""
    if not plan or plan[-1] != spp or plan[0] <= 0:
        raise ValueError(f"pass plan {plan!r} must be positive and end at spp={spp}")
    if any(b <= a for a, b in itertools.pairwise(plan)):
        raise ValueError(f"pass plan {plan!r} is not increasing")
    return plan


@dataclass(frozen=True)
class Found:
    """A renderer a worker can run: its name, version and executable (``None``: in-process)."""

    name: str
    version: str
    executable: str | None = None


_VERSION_RE = {
    "blender": re.compile(r"^Blender (\d+(?:\.\d+)+)", re.MULTILINE),
    "povray": re.compile(r"^POV-Ray (\d+(?:\.\d+)+)", re.MULTILINE),
}
"""How each external renderer's ``--version`` output states its version."""

PROBE_TIMEOUT = 30.0
"""Seconds a renderer's ``--version`` may take at worker start (Blender takes about 0.5 s)."""


def probe(name: str, path: str | None = None) -> Found | None:
    """The renderer ``name`` if it runs here (on ``path``, default ``PATH``), else ``None``."""
    if name == TESSERA:
        from kernel.hashing import KERNEL_VERSION

        return Found(TESSERA, KERNEL_VERSION)
    if name not in _VERSION_RE:
        raise ConfigError(f"renderer {name!r} is unknown (known: {', '.join(NAMES)})")
    executable = shutil.which(name, path=path)
    if executable is None:
        return None
    version = version_of(name, executable)
    return None if version is None else Found(name, version, executable)


def version_of(name: str, executable: str) -> str | None:
    """The version ``executable --version`` states for the renderer ``name`` (``3.4.1``,
    ``3.7.0.10``), or ``None`` if it does not run or states none: the one parser of versions,
    so the version in checkpoint hashes and the one announced are the same string."""
    pattern = _VERSION_RE[name]
    try:
        done = subprocess.run(
            [executable, "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PROBE_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = pattern.search(done.stdout + "\n" + done.stderr)
    if done.returncode != 0 or match is None:
        return None
    return match.group(1)


def parse_setting(value: str) -> list[str] | None:
    """The renderers ``TESSERA_RENDERERS`` lists, or ``None`` for ``auto``."""
    value = value.strip()
    if value in ("", "auto"):
        return None
    listed = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in listed if name not in NAMES]
    if unknown or not listed:
        raise ConfigError(
            f"TESSERA_RENDERERS: {value!r} is 'auto' or a comma-separated list of "
            f"{', '.join(NAMES)}"
        )
    return list(dict.fromkeys(listed))


def implemented(name: str) -> bool:
    """True if this installation has the module of renderer ``name``."""
    return importlib.util.find_spec(f"services.worker.renderers.{name}") is not None


def discover(setting: str = "auto", path: str | None = None) -> dict[str, Found]:
    """The renderers this worker runs, by name: all found with ``auto``, else those listed.

    A listed renderer that is not found raises :class:`ConfigError` (a worker told to run
    POV-Ray that cannot would otherwise sit idle while POV-Ray jobs wait).
    """
    listed = parse_setting(setting)
    found: dict[str, Found] = {}
    for name in listed if listed is not None else [r for r in NAMES if implemented(r)]:
        here = probe(name, path)
        if here is not None:
            found[name] = here
        elif listed is not None:
            raise ConfigError(f"TESSERA_RENDERERS lists {name!r}, but {name} is not on PATH")
    return found


_DISCOVERED: dict[str, Found] | None = None


def available_renderers(setting: str | None = None) -> dict[str, str]:
    """``{name: version}`` of the renderers this worker runs (discovered once per process).

    ``setting`` defaults to ``TESSERA_RENDERERS`` (``auto``). This is what the worker
    announces in the ``tessera-workers`` bucket.
    """
    return {name: found.version for name, found in discovered(setting).items()}


def discovered(setting: str | None = None) -> dict[str, Found]:
    """:func:`discover` once per process (``--version`` of Blender takes about 0.5 s)."""
    global _DISCOVERED
    if _DISCOVERED is None:
        _DISCOVERED = discover(
            setting if setting is not None else os.environ.get("TESSERA_RENDERERS", "auto")
        )
    return dict(_DISCOVERED)


def create(found: Found, slots: int) -> Renderer:
    """The renderer ``found`` names, from its module's ``create(found, slots)``."""
    if found.name not in NAMES:
        raise ConfigError(f"renderer {found.name!r} is unknown (known: {', '.join(NAMES)})")
    module = importlib.import_module(f"services.worker.renderers.{found.name}")
    renderer: Renderer = module.create(found, slots)
    return renderer


def create_all(found: Mapping[str, Found], slots: int) -> dict[str, Renderer]:
    """One renderer per discovered name."""
    return {name: create(f, slots) for name, f in found.items()}
