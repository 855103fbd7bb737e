"""Uploading a scene and everything it needs as an asset (see :mod:`proto.assets`).

:func:`upload_scene` is what ``tessera submit scene.pov`` / ``shot.blend`` calls before it
submits: it collects the scene's files, refuses what an asset cannot hold, uploads the chunks the
object store lacks through the gateway and stores the manifest; the job then names the asset by
its manifest's sha256. Nothing is ever held whole in memory: a file is read and hashed a chunk
(4 MiB) at a time, and at most :data:`IN_FLIGHT` chunks are on their way at once.

Dependencies:

- **POV-Ray** (``povray``): the main file, and every file it names with a literal string, found
  by :func:`proto.assets.pov_dependencies`: ``#include "f"`` (followed recursively) and a file
  after an image or data type keyword (``png "wood.png"`` in ``image_map``/``height_field``/...,
  ``ttf``, ``df3``), all relative to the scene's directory (where POV-Ray runs). POV-Ray's own
  library files (``colors.inc`` ...) are left to the worker's POV-Ray. Each scanned file is
  checked by :func:`proto.povray.check_povray_source` (no jitter, no radiosity: they cannot
  tile exactly), so such a scene is refused (exit 2) before anything is uploaded.
- **Blender** (``blender``): the ``.blend`` and every external file
  ``bpy.utils.blend_paths(absolute=False, packed=False)`` lists, asked of Blender itself
  (``blender -b --factory-startup``), so Blender must be on PATH: without it the client cannot
  know what a ``.blend`` needs, and a missing texture would render without error, so the submit is
  refused (exit 2). Only relative (``//``) paths inside the ``.blend``'s directory are accepted;
  packed files travel inside the ``.blend``. Linked libraries are uploaded, not scanned in turn.
- any other renderer: the main file alone.

Refused before anything is uploaded (:class:`AssetRefused`, exit status 2): a path outside the
scene's directory (``..``), an absolute path, a backslash or drive letter, a missing file, two
paths that differ only by case, an asset over the gateway's ``TESSERA_ASSET_MAX_BYTES``.

Deduplicated and resumable: the client asks ``asset.missing`` which chunks the store lacks and
sends only those, so a second upload of the same files sends nothing, and an upload interrupted
half way sends only the rest when run again. ``busy`` replies are retried like every verb's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Never

import orjson
from tqdm import tqdm

from proto.assets import MAX_SCAN_BYTES, AssetFile, Manifest, check_asset_path, pov_dependencies
from proto.limits import ASSET_CHUNK_BYTES, MAX_MISSING_QUERY
from proto.povray import check_povray_source
from services.client.api import TesseraClient
from services.client.session import EXIT_USAGE, CommandFailed
from shared.core.errors import DecodeError, ValidationError
from shared.objectstore import sha256_hex

__all__ = [
    "IN_FLIGHT",
    "AssetRefused",
    "BlendInfo",
    "blend_info",
    "collect_files",
    "upload_scene",
]

IN_FLIGHT = 2
"""Chunks on their way to the gateway at once (one being read while one is stored)."""
BLENDER_TIMEOUT = 120.0
"""Seconds Blender may take to open a ``.blend`` and list its files."""
_MARK = "TESSERA-BLEND-INFO:"
_BLEND_SCRIPT = (
    "import bpy, json, sys; s = bpy.context.scene; r = s.render; "
    "print(" + repr(_MARK) + " + json.dumps({"
    "'paths': sorted(set(bpy.utils.blend_paths(absolute=False, packed=False))), "
    "'width': r.resolution_x * r.resolution_percentage // 100, "
    "'height': r.resolution_y * r.resolution_percentage // 100, "
    "'frame': s.frame_current, 'samples': s.cycles.samples, 'engine': r.engine}), flush=True); "
    "sys.stdout.flush()"
)


class AssetRefused(CommandFailed):
    """The scene cannot become an asset (a path outside its directory, a missing file ...)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


@dataclass(frozen=True)
class _Local:
    """One file to upload: its path in the asset and on this disk."""

    rel: str
    path: Path


async def upload_scene(
    client: TesseraClient, main: Path, renderer: str, progress: bool
) -> tuple[str, str]:
    """Upload ``main`` and its dependencies for ``renderer``; (manifest sha256, main's path).

    ``client`` is the session's :class:`~services.client.api.TesseraClient` (``session.client``
    in a command). Raises :class:`AssetRefused` (exit 2) for a scene that cannot be an asset,
    :class:`~proto.replies.ApiError` for a gateway's refusal.
    """
    limits = await client.asset_missing([])
    files = await collect_files(main, renderer)
    sizes = {f.rel: f.path.stat().st_size for f in files}
    total = sum(sizes.values())
    if total > limits["max_asset_bytes"]:
        raise AssetRefused(
            f"{main}: the scene's {len(files)} files have {total} bytes, above the gateway's "
            f"limit of {limits['max_asset_bytes']} bytes (TESSERA_ASSET_MAX_BYTES)"
        )
    entries = [await asyncio.to_thread(_hash_file, f) for f in files]
    try:
        manifest = Manifest.build(files[0].rel, entries, max_bytes=limits["max_asset_bytes"])
    except (DecodeError, ValidationError) as exc:
        raise AssetRefused(f"{main}: {exc}") from exc
    where = {f.rel: f.path for f in files}
    missing: list[str] = []
    chunks = manifest.chunks()
    step = min(MAX_MISSING_QUERY, limits["max_query"])
    for start in range(0, len(chunks), step):
        missing += (await client.asset_missing(chunks[start : start + step]))["missing"]
    places = _places(manifest, set(missing))
    todo = sum(size for _, _, size in places.values())
    bar = tqdm(
        total=manifest.size,
        initial=manifest.size - todo,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=main.name,
        disable=not progress,
        file=sys.stderr,
        leave=False,
    )
    try:
        await _send(client, places, where, bar)
    finally:
        bar.close()
    reply = await client.asset_manifest(manifest.to_json(), renderer)
    if reply["asset"] != sha256_hex(manifest.canonical()):
        raise DecodeError(f"asset.manifest: the gateway's reference {reply['asset']} is not ours")
    return reply["asset"], manifest.main


def _places(manifest: Manifest, missing: set[str]) -> dict[str, tuple[str, int, int]]:
    """Where to read each missing chunk: file path, offset, size (its first place)."""
    places: dict[str, tuple[str, int, int]] = {}
    for f in manifest.files:
        for i, digest in enumerate(f.chunks):
            if digest in missing and digest not in places:
                offset = i * ASSET_CHUNK_BYTES
                places[digest] = (f.path, offset, min(ASSET_CHUNK_BYTES, f.size - offset))
    return places


async def _send(
    client: TesseraClient,
    places: dict[str, tuple[str, int, int]],
    where: dict[str, Path],
    bar: tqdm[Never],
) -> None:
    """Read and send every chunk of ``places``, :data:`IN_FLIGHT` at once."""
    queue = list(places.items())

    async def sender() -> None:
        while queue:
            digest, (rel, offset, size) = queue.pop(0)
            data = await asyncio.to_thread(_read, where[rel], offset, size)
            if sha256_hex(data) != digest:
                raise AssetRefused(f"{where[rel]} changed while it was uploaded: submit again")
            await client.asset_chunk(digest, data)
            del data
            bar.update(size)

    tasks = [asyncio.create_task(sender()) for _ in range(IN_FLIGHT)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _read(path: Path, offset: int, size: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise AssetRefused(f"{path} changed while it was uploaded (it is shorter): submit again")
    return data


def _hash_file(local: _Local) -> AssetFile:
    """Size, sha256 and chunk digests of one file, read a chunk at a time."""
    whole = hashlib.sha256()
    chunks: list[str] = []
    size = 0
    try:
        with local.path.open("rb") as f:
            while data := f.read(ASSET_CHUNK_BYTES):
                whole.update(data)
                chunks.append(hashlib.sha256(data).hexdigest())
                size += len(data)
    except OSError as exc:
        raise AssetRefused(f"{local.path}: cannot read it: {exc.strerror or exc}") from exc
    return AssetFile(local.rel, size, whole.hexdigest(), tuple(chunks))


# ------------------------------------------------------------------------------ dependencies


async def collect_files(main: Path, renderer: str) -> list[_Local]:
    """The files of ``main``'s asset for ``renderer``, ``main`` first; refuses what an asset
    cannot hold (see the module docstring)."""
    if not await asyncio.to_thread(main.is_file):
        raise AssetRefused(f"{main}: no such scene file")
    blend = await asyncio.to_thread(main.absolute)
    root, name = blend.parent, main.name
    try:
        check_asset_path(name, "scene file name")
    except (DecodeError, ValidationError) as exc:
        raise AssetRefused(f"{main}: {exc}") from exc
    if renderer == "povray":
        rels = await asyncio.to_thread(_pov_files, root, name)
    elif renderer == "blender":
        rels = [name, *await _blend_files(blend, root)]
    else:
        rels = [name]
    return [_Local(rel, root / rel) for rel in dict.fromkeys(rels)]


def _pov_files(root: Path, main: str) -> list[str]:
    def have(rel: str) -> bool:
        return (root / rel).is_file()

    def read(rel: str) -> str | None:
        path = root / rel
        if path.stat().st_size > MAX_SCAN_BYTES:
            return None
        text = path.read_bytes().decode("latin-1")
        check_povray_source(text, rel)  # refused before anything is uploaded
        return text

    try:
        return pov_dependencies(main, read, have)
    except ValidationError as exc:
        raise AssetRefused(f"{root / main}: {exc}") from exc
    except OSError as exc:
        raise AssetRefused(f"{root / main}: {exc}") from exc


async def _blend_files(blend: Path, root: Path) -> list[str]:
    """The external files Blender says ``blend`` uses, as asset paths (checked)."""
    paths = await blend_paths(blend)
    rels: list[str] = []
    for raw in paths:
        if not raw.startswith("//"):
            raise AssetRefused(
                f"{blend} uses the absolute path {raw!r:.200}: make it relative to the .blend "
                "(File > External Data > Make Paths Relative) or pack it (Pack Resources)"
            )
        rel = raw[2:]
        try:
            check_asset_path(str(PurePosixPath(rel)) if rel else rel, "path")
        except (DecodeError, ValidationError) as exc:
            resolved = PurePosixPath(os.path.normpath(f"{root}/{rel}"))  # noqa: ASYNC240
            raise AssetRefused(
                f"{blend} uses {raw!r:.200} ({resolved}), which is not a file inside its "
                f"directory ({str(exc).removeprefix('path: ')}): move it next to the .blend"
            ) from None
        if not await asyncio.to_thread((root / rel).is_file):
            raise AssetRefused(f"{blend} uses {raw!r:.200}, which does not exist: a missing file")
        rels.append(str(PurePosixPath(rel)))
    return rels


@dataclass(frozen=True)
class BlendInfo:
    """What Blender says of a ``.blend``: its external files and its render settings."""

    #: ``bpy.utils.blend_paths(absolute=False, packed=False)``
    paths: tuple[str, ...]
    #: the output size: ``resolution_x/_y`` times ``resolution_percentage`` / 100
    width: int
    height: int
    #: ``scene.frame_current``
    frame: int
    #: ``cycles.samples``
    samples: int
    #: ``render.engine`` (Tessera renders with Cycles whatever it says)
    engine: str


_INFO: dict[tuple[str, int, int], BlendInfo] = {}
"""What Blender said of a file, by (absolute path, mtime_ns, size): a submit asks once."""


async def blend_paths(blend: Path) -> list[str]:
    """``bpy.utils.blend_paths(absolute=False, packed=False)`` of ``blend``, asked of Blender."""
    return list((await blend_info(blend)).paths)


async def blend_info(blend: Path) -> BlendInfo:
    """:class:`BlendInfo` of ``blend``, asked of Blender once per version of the file (a
    submit reads the render settings and lists the files: one Blender run). Blender must be on
    PATH either way."""
    _blender(blend)
    try:
        st = await asyncio.to_thread(blend.stat)
    except OSError as exc:
        raise AssetRefused(f"{blend}: cannot read it: {exc.strerror or exc}") from exc
    key = (str(await asyncio.to_thread(blend.absolute)), st.st_mtime_ns, st.st_size)
    if key not in _INFO:
        _INFO[key] = await _ask_blender(blend)
    return _INFO[key]


def _blender(blend: Path) -> str:
    exe = shutil.which("blender")
    if exe is None:
        raise AssetRefused(
            f"{blend}: blender is not on PATH, and the client needs it to list the files a .blend "
            "uses (textures, linked libraries); install Blender on this machine to submit it"
        )
    return exe


async def _ask_blender(blend: Path) -> BlendInfo:
    exe = _blender(blend)
    proc = await asyncio.create_subprocess_exec(
        exe,
        "-b",
        "-noaudio",
        "--factory-startup",
        str(blend),
        "--python-expr",
        _BLEND_SCRIPT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), BLENDER_TIMEOUT)
    except BaseException:
        _kill_group(proc.pid)
        await proc.wait()
        raise
    text = out.decode(errors="replace")
    for line in text.splitlines():
        if line.startswith(_MARK):
            said = orjson.loads(line[len(_MARK) :])
            return BlendInfo(
                paths=tuple(str(p) for p in said["paths"]),
                width=int(said["width"]),
                height=int(said["height"]),
                frame=int(said["frame"]),
                samples=int(said["samples"]),
                engine=str(said["engine"]),
            )
    tail = "\n".join(text.splitlines()[-5:])
    raise AssetRefused(f"{blend}: Blender could not read it (exit {proc.returncode}):\n{tail}")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
