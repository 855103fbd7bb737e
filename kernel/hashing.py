"""Content hash of everything that determines a frame's pixels."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any

from kernel.settings import RenderSettings, check_frame
from kernel.validate import validate_scene

KERNEL_VERSION = "1.0.0"
"""Bump whenever the kernel may produce different pixels for the same inputs."""

KERNEL_RENDERER = "tessera"
"""The renderer name of this kernel (``jobs.renderer``)."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only; floats in Python's shortest round-trip form."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def _sha256(payload: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(payload).encode("ascii")).hexdigest()


def input_hash(doc: dict[str, Any], frame: int, settings: RenderSettings) -> str:
    """sha256 hex of (renderer ``tessera``, KERNEL_VERSION, canonical scene, frame, settings).

    The scene is hashed in its validated, canonical form (:meth:`kernel.scene.Scene.to_doc`):
    defaults filled in and every coordinate a float, so key order, whitespace, ``1`` vs ``1.0``
    and omitted defaults do not change the hash, while any value that reaches the tracer does.
    Raises :class:`~kernel.scene.SceneError` for invalid inputs.
    """
    payload = {
        "renderer": KERNEL_RENDERER,
        "kernel_version": KERNEL_VERSION,
        "scene": validate_scene(doc).to_doc(),
        "frame": check_frame(frame),
        "settings": dataclasses.asdict(settings.validate()),
    }
    return _sha256(payload)


def reference_input_hash(
    renderer: str, reference: dict[str, Any], frame: int, settings: dict[str, Any]
) -> str:
    """sha256 hex of a job rendered by an external renderer (``blender``, ``povray``).

    ``reference`` is the job's scene reference (``{"asset": <manifest sha256>, "main": <path>,
    ...renderer options}``): the manifest's sha256 names every byte of every file of the scene,
    so the hash changes with any of them. ``settings`` are the request's image settings
    (width, height, spp, ...). The renderer's *version* is not known at submit (each worker has
    its own): :func:`checkpoint_hash` mixes it in where it matters, in every checkpoint.
    """
    payload = {
        "renderer": renderer,
        "scene": reference,
        "frame": check_frame(frame),
        "settings": settings,
    }
    return _sha256(payload)


@functools.lru_cache(maxsize=256)  # asked for every tile a worker leases (10 us of JSON and sha256)
def checkpoint_hash(job_input_hash: str, renderer: str, version: str) -> str:
    """The hash a tile's progress pointer carries: the job's inputs and the renderer that made it.

    A worker resumes a checkpoint only if the pointer's hash is this value for its own renderer
    name and version, so a checkpoint made by another version of the renderer (Blender 3.4 vs
    3.6, or a kernel whose :data:`KERNEL_VERSION` changed) is never resumed: that tile starts
    over. Every pointer written before renderers had versions differs too (one restart).
    """
    payload = {"input_hash": job_input_hash, "renderer": renderer, "version": version}
    return _sha256(payload)
