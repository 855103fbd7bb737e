"""Tessera's render kernel: a pure, deterministic numba path tracer.

Resumed, re-tiled, serial and parallel renders of the same inputs are bit-identical because
every sample's random numbers are a hash of (seed, frame, pixel, sample, dimension) and each
pixel's samples are summed in order. No I/O except :func:`load_scene_file`, no global state.
See ``kernel/README.md`` for the scene format and limits.
"""

from kernel.builtin import BUILTIN_SCENES, builtin_scene
from kernel.flatten import Prepared, prepare
from kernel.hashing import KERNEL_VERSION, input_hash
from kernel.image import (
    encode_float_image,
    encode_png,
    float_image_and_tonemap,
    png_of,
    tonemap,
)
from kernel.loader import load_scene_file
from kernel.render import render_full, render_tile
from kernel.scene import Scene, SceneError
from kernel.settings import RenderSettings
from kernel.validate import validate_scene

__all__ = [
    "BUILTIN_SCENES",
    "KERNEL_VERSION",
    "Prepared",
    "RenderSettings",
    "Scene",
    "SceneError",
    "builtin_scene",
    "encode_float_image",
    "encode_png",
    "float_image_and_tonemap",
    "input_hash",
    "load_scene_file",
    "png_of",
    "prepare",
    "render_full",
    "render_tile",
    "tonemap",
    "validate_scene",
]
