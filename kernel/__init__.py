"""Tessera's render kernel: a pure, deterministic numba path tracer.

Resumed, re-tiled, serial and parallel renders of the same inputs are bit-identical because
every sample's random numbers are a hash of (seed, frame, pixel, sample, dimension) and each
pixel's samples are summed in order. No I/O except :func:`load_scene_file`, no global state.
See ``kernel/README.md`` for the scene format and limits.

The names below are loaded on first use, each from its own module, so ``import kernel`` costs
nothing and the scene format (:mod:`kernel.scene`, :mod:`kernel.builtin`,
:func:`kernel.loader.read_scene_file`) is usable without numpy or numba: the client-only install
(``pip install tessera``, without the ``render`` extra) reads scene files with it. Validation and
hashing need numpy; preparing and rendering need numba; the image encoders need numpy and isal.
A service that renders imports its kernel module at start-up (``import kernel.render``), so the
first tile does not pay for loading numba.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernel.builtin import BUILTIN_SCENES, builtin_scene
    from kernel.flatten import Prepared, prepare
    from kernel.hashing import KERNEL_VERSION, input_hash
    from kernel.image import (
        display8,
        display_images,
        encode_float_image,
        encode_png,
        float_image_and_display16,
        float_image_and_tonemap,
        float_npy,
        png16_of,
        png_of,
        tonemap,
    )
    from kernel.loader import load_scene_file
    from kernel.rect import Rect
    from kernel.render import render_full, render_tile
    from kernel.scene import Scene, SceneError
    from kernel.settings import RenderSettings
    from kernel.validate import validate_scene

_HOME = {
    "BUILTIN_SCENES": "builtin",
    "builtin_scene": "builtin",
    "Prepared": "flatten",
    "prepare": "flatten",
    "KERNEL_VERSION": "hashing",
    "input_hash": "hashing",
    "display8": "image",
    "display_images": "image",
    "encode_float_image": "image",
    "encode_png": "image",
    "float_image_and_display16": "image",
    "float_image_and_tonemap": "image",
    "float_npy": "image",
    "png16_of": "image",
    "png_of": "image",
    "tonemap": "image",
    "load_scene_file": "loader",
    "Rect": "rect",
    "render_full": "render",
    "render_tile": "render",
    "Scene": "scene",
    "SceneError": "scene",
    "RenderSettings": "settings",
    "validate_scene": "validate",
}
"""Where each public name lives: ``kernel.NAME`` imports ``kernel.<module>`` on first use."""

__all__ = [
    "BUILTIN_SCENES",
    "KERNEL_VERSION",
    "Prepared",
    "Rect",
    "RenderSettings",
    "Scene",
    "SceneError",
    "builtin_scene",
    "display8",
    "display_images",
    "encode_float_image",
    "encode_png",
    "float_image_and_display16",
    "float_image_and_tonemap",
    "float_npy",
    "input_hash",
    "load_scene_file",
    "png16_of",
    "png_of",
    "prepare",
    "render_full",
    "render_tile",
    "tonemap",
    "validate_scene",
]

if not TYPE_CHECKING:  # for mypy, the imports above: a misspelt name stays an error

    def __getattr__(name: str) -> Any:
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module 'kernel' has no attribute {name!r}")
        value = getattr(importlib.import_module(f"kernel.{home}"), name)
        globals()[name] = value  # later look-ups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_HOME})
