"""Content hash of everything that determines a frame's pixels."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from kernel.settings import RenderSettings, check_frame
from kernel.validate import validate_scene

KERNEL_VERSION = "1.0.0"
"""Bump whenever the kernel may produce different pixels for the same inputs."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only; floats in Python's shortest round-trip form."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def input_hash(doc: dict[str, Any], frame: int, settings: RenderSettings) -> str:
    """sha256 hex of (KERNEL_VERSION, canonical scene, frame, settings).

    The scene is hashed in its validated, canonical form (:meth:`kernel.scene.Scene.to_doc`):
    defaults filled in and every coordinate a float, so key order, whitespace, ``1`` vs ``1.0``
    and omitted defaults do not change the hash, while any value that reaches the tracer does.
    Raises :class:`~kernel.scene.SceneError` for invalid inputs.
    """
    payload = {
        "kernel_version": KERNEL_VERSION,
        "scene": validate_scene(doc).to_doc(),
        "frame": check_frame(frame),
        "settings": dataclasses.asdict(settings.validate()),
    }
    return hashlib.sha256(canonical_json(payload).encode("ascii")).hexdigest()
