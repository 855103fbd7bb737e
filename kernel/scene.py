"""The typed, frozen scene model that validation produces, and the documented limits.

A :class:`Scene` is built only by :func:`kernel.validate.validate_scene`; everything inside it is
already checked, normalised to floats, and within the limits below. :meth:`Scene.to_doc` turns
it back into the canonical JSON document that :func:`kernel.hashing.input_hash` hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only annotations: the scene format itself needs no numpy
    import numpy as np

FORMAT_VERSION = 1
"""The scene document format this kernel reads (the optional ``version`` field)."""

MAX_SPHERES = 1024
MAX_MESHES = 64
MAX_TRIANGLES = 200_000
"""Total over all meshes."""
MAX_VERTICES = 200_000
"""Per mesh."""
MAX_MATERIALS = 256
MAX_NAME_LENGTH = 64
MAX_COORD = 1e7
"""Bound on the absolute value of every coordinate, radius, distance and translation."""
MAX_EMISSION = 1e6
"""Bound on emission and sky colour components (albedo colours are limited to [0, 1])."""
MAX_SCALE = 1e6
MAX_IOR = 4.0

Vec3 = tuple[float, float, float]


class SceneError(ValueError):
    """A scene document or render setting is invalid; the message names the field and limit."""


@dataclass(frozen=True)
class Orbit:
    """Camera animation: rotate the whole camera about ``axis`` through ``center``.

    Frame ``f`` uses the angle ``f * degrees_per_frame``; frame 0 is the camera as written.
    """

    center: Vec3
    axis: Vec3
    degrees_per_frame: float


@dataclass(frozen=True)
class Camera:
    """Pinhole or thin-lens camera; ``near`` moves ray origins ahead, as smallpt does."""

    position: Vec3
    look_at: Vec3
    up: Vec3
    vfov: float
    aperture: float
    focus_distance: float | None
    near: float
    orbit: Orbit | None


@dataclass(frozen=True)
class Material:
    """One named material; ``kind`` is diffuse, metal, dielectric or emissive."""

    name: str
    kind: str
    color: Vec3
    emission: Vec3
    roughness: float
    ior: float


@dataclass(frozen=True)
class Sphere:
    center: Vec3
    radius: float
    material: str


@dataclass(frozen=True, eq=False)
class Mesh:
    """A triangle mesh; world position = vertex * scale + translate.

    ``vertices`` (n, 3) float64 and ``indices`` (m, 3) int64 are read-only arrays.
    """

    vertices: np.ndarray
    indices: np.ndarray
    material: str
    scale: float
    translate: Vec3


@dataclass(frozen=True)
class Scene:
    """A validated scene. Materials are sorted by name; spheres and meshes keep file order."""

    camera: Camera
    sky: Vec3
    materials: tuple[Material, ...]
    spheres: tuple[Sphere, ...]
    meshes: tuple[Mesh, ...] = field(default=())

    def to_doc(self) -> dict[str, Any]:
        """The canonical document: every field present, every number normalised."""
        return {
            "version": FORMAT_VERSION,
            "camera": _camera_doc(self.camera),
            "sky": list(self.sky),
            "materials": {m.name: _material_doc(m) for m in self.materials},
            "spheres": [
                {"center": list(s.center), "radius": s.radius, "material": s.material}
                for s in self.spheres
            ],
            "meshes": [_mesh_doc(m) for m in self.meshes],
        }


def _camera_doc(c: Camera) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "position": list(c.position),
        "look_at": list(c.look_at),
        "up": list(c.up),
        "vfov": c.vfov,
        "aperture": c.aperture,
        "near": c.near,
    }
    if c.focus_distance is not None:
        doc["focus_distance"] = c.focus_distance
    if c.orbit is not None:
        doc["orbit"] = {
            "center": list(c.orbit.center),
            "axis": list(c.orbit.axis),
            "degrees_per_frame": c.orbit.degrees_per_frame,
        }
    return doc


def _material_doc(m: Material) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": m.kind}
    if m.kind == "emissive":
        doc["emission"] = list(m.emission)
        return doc
    doc["color"] = list(m.color)
    if m.kind == "metal":
        doc["roughness"] = m.roughness
    if m.kind == "dielectric":
        doc["ior"] = m.ior
    return doc


def _mesh_doc(m: Mesh) -> dict[str, Any]:
    return {
        "vertices": m.vertices.tolist(),
        "indices": m.indices.tolist(),
        "material": m.material,
        "scale": m.scale,
        "translate": list(m.translate),
    }
