"""Scene document → :class:`~kernel.scene.Scene`, rejecting anything outside the documented limits.

Every error is a :class:`~kernel.scene.SceneError` whose message starts with the offending
field's path (``spheres[3].radius``, ``materials.glass.ior``) and states the limit it broke.
Unknown fields are errors too, so a typo can never silently leave a default in place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from kernel import scene as s
from kernel.scene import SceneError

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_MATERIAL_KINDS = ("diffuse", "metal", "dielectric", "emissive")


def validate_scene(doc: object) -> s.Scene:
    """Validate a scene document (see ``kernel/README.md``) and return the typed model."""
    d = _fields(doc, "scene", required=("camera", "materials"), optional=_TOP_OPTIONAL)
    version = d.get("version", s.FORMAT_VERSION)
    if version != s.FORMAT_VERSION or isinstance(version, bool):
        raise SceneError(f"version must be {s.FORMAT_VERSION} (got {version!r})")
    materials = _materials(d["materials"])
    names = {m.name for m in materials}
    spheres = _list(d.get("spheres", []), "spheres", s.MAX_SPHERES)
    meshes = _list(d.get("meshes", []), "meshes", s.MAX_MESHES)
    result = s.Scene(
        camera=_camera(d["camera"]),
        sky=vec3(d.get("sky", [0.0, 0.0, 0.0]), "sky", 0.0, s.MAX_EMISSION),
        materials=materials,
        spheres=tuple(_sphere(x, f"spheres[{i}]", names) for i, x in enumerate(spheres)),
        meshes=tuple(_mesh(x, f"meshes[{i}]", names) for i, x in enumerate(meshes)),
    )
    total = sum(len(m.indices) for m in result.meshes)
    if total > s.MAX_TRIANGLES:
        raise SceneError(
            f"meshes must have at most {s.MAX_TRIANGLES} triangles in total (got {total})"
        )
    if not result.spheres and not result.meshes:
        raise SceneError("scene must contain at least one sphere or mesh")
    return result


_TOP_OPTIONAL = ("version", "sky", "spheres", "meshes")


def _fields(
    value: object, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SceneError(f"{path} must be an object")
    allowed = required + optional
    for key in value:
        if key not in allowed:
            raise SceneError(f"{path}.{key} is not a known field (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            raise SceneError(f"{path}.{key} is required")
    return value


def _list(value: object, path: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise SceneError(f"{path} must be a list")
    if len(value) > limit:
        raise SceneError(f"{path} must have at most {limit} entries (got {len(value)})")
    return value


def number(
    value: object, path: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """A finite float in the given range; ``-0.0`` is normalised to ``0.0``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SceneError(f"{path} must be a number")
    try:
        x = float(value) + 0.0
    except OverflowError:
        raise SceneError(f"{path} must be a finite number") from None
    if not math.isfinite(x):
        raise SceneError(f"{path} must be a finite number")
    if x < lo or (lo_open and x == lo):
        raise SceneError(f"{path} must be {'>' if lo_open else '>='} {lo:g}")
    if x > hi or (hi_open and x == hi):
        raise SceneError(f"{path} must be {'<' if hi_open else '<='} {hi:g}")
    return x


def vec3(value: object, path: str, lo: float = -s.MAX_COORD, hi: float = s.MAX_COORD) -> s.Vec3:
    """A list of three numbers, each in [lo, hi]."""
    if not isinstance(value, list) or len(value) != 3:
        raise SceneError(f"{path} must be a list of 3 numbers")
    x, y, z = (number(v, f"{path}[{i}]", lo, hi) for i, v in enumerate(value))
    return (x, y, z)


def _nonzero(v: s.Vec3, path: str) -> s.Vec3:
    if v == (0.0, 0.0, 0.0):
        raise SceneError(f"{path} must not be the zero vector")
    return v


def _camera(value: object) -> s.Camera:
    p = "camera"
    d = _fields(value, p, ("position", "look_at", "vfov"), _CAMERA_OPTIONAL)
    pos = vec3(d["position"], f"{p}.position")
    look = vec3(d["look_at"], f"{p}.look_at")
    up = _nonzero(vec3(d.get("up", [0.0, 1.0, 0.0]), f"{p}.up"), f"{p}.up")
    view = np.subtract(look, pos)
    if not np.any(view):
        raise SceneError(f"{p}.look_at must differ from {p}.position")
    if (
        np.linalg.norm(np.cross(view / np.linalg.norm(view), np.divide(up, np.linalg.norm(up))))
        < 1e-6
    ):
        raise SceneError(f"{p}.up must not be parallel to look_at - position")
    focus = d.get("focus_distance")
    return s.Camera(
        position=pos,
        look_at=look,
        up=up,
        vfov=number(d["vfov"], f"{p}.vfov", 0.0, 179.0, lo_open=True),
        aperture=number(d.get("aperture", 0.0), f"{p}.aperture", 0.0, s.MAX_COORD),
        focus_distance=None
        if focus is None
        else number(focus, f"{p}.focus_distance", 0.0, s.MAX_COORD, lo_open=True),
        near=number(d.get("near", 0.0), f"{p}.near", 0.0, s.MAX_COORD),
        orbit=None if "orbit" not in d else _orbit(d["orbit"], look, up),
    )


_CAMERA_OPTIONAL = ("up", "aperture", "focus_distance", "near", "orbit")


def _orbit(value: object, look_at: s.Vec3, up: s.Vec3) -> s.Orbit:
    p = "camera.orbit"
    d = _fields(value, p, ("degrees_per_frame",), ("center", "axis"))
    return s.Orbit(
        center=vec3(d.get("center", list(look_at)), f"{p}.center"),
        axis=_nonzero(vec3(d.get("axis", list(up)), f"{p}.axis"), f"{p}.axis"),
        degrees_per_frame=number(d["degrees_per_frame"], f"{p}.degrees_per_frame", -360.0, 360.0),
    )


def _materials(value: object) -> tuple[s.Material, ...]:
    if not isinstance(value, Mapping):
        raise SceneError("materials must be an object mapping names to materials")
    if not value:
        raise SceneError("materials must have at least 1 entry")
    if len(value) > s.MAX_MATERIALS:
        raise SceneError(
            f"materials must have at most {s.MAX_MATERIALS} entries (got {len(value)})"
        )
    out = []
    for name in sorted(value):
        if not isinstance(name, str) or not _NAME.match(name) or len(name) > s.MAX_NAME_LENGTH:
            raise SceneError(
                f"materials.{name} name must be 1..{s.MAX_NAME_LENGTH} characters"
                " of A-Z a-z 0-9 _ . -"
            )
        out.append(_material(value[name], name))
    return tuple(out)


def _material(value: object, name: str) -> s.Material:
    p = f"materials.{name}"
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind not in _MATERIAL_KINDS:
        raise SceneError(f"{p}.type must be one of {', '.join(_MATERIAL_KINDS)}")
    if kind == "emissive":
        d = _fields(value, p, ("type", "emission"))
        emission = vec3(d["emission"], f"{p}.emission", 0.0, s.MAX_EMISSION)
        return s.Material(name, kind, (0.0, 0.0, 0.0), emission, 0.0, 1.0)
    extra = {"metal": ("roughness",), "dielectric": ("ior",)}.get(kind, ())
    d = _fields(value, p, ("type", "color"), extra)
    color = vec3(d["color"], f"{p}.color", 0.0, 1.0)
    rough = number(d.get("roughness", 0.0), f"{p}.roughness", 0.0, 1.0)
    ior = number(d.get("ior", 1.5), f"{p}.ior", 1.0, s.MAX_IOR)
    return s.Material(name, kind, color, (0.0, 0.0, 0.0), rough, ior)


def _material_ref(value: object, path: str, names: set[str]) -> str:
    if not isinstance(value, str) or value not in names:
        raise SceneError(f"{path} must name one of the materials (got {value!r})")
    return value


def _sphere(value: object, p: str, names: set[str]) -> s.Sphere:
    d = _fields(value, p, ("center", "radius", "material"))
    return s.Sphere(
        center=vec3(d["center"], f"{p}.center"),
        radius=number(d["radius"], f"{p}.radius", 0.0, s.MAX_COORD, lo_open=True),
        material=_material_ref(d["material"], f"{p}.material", names),
    )


def _mesh(value: object, p: str, names: set[str]) -> s.Mesh:
    if isinstance(value, Mapping) and "obj" in value:
        raise SceneError(f"{p}.obj must be inlined: load scene files with load_scene_file()")
    d = _fields(value, p, ("vertices", "indices", "material"), ("scale", "translate"))
    verts = _list(d["vertices"], f"{p}.vertices", s.MAX_VERTICES)
    tris = _list(d["indices"], f"{p}.indices", s.MAX_TRIANGLES)
    scale = number(d.get("scale", 1.0), f"{p}.scale", 0.0, s.MAX_SCALE, lo_open=True)
    translate = vec3(d.get("translate", [0.0, 0.0, 0.0]), f"{p}.translate")
    if not tris:
        raise SceneError(f"{p}.indices must have at least 1 entry")
    rows = [vec3(v, f"{p}.vertices[{i}]") for i, v in enumerate(verts)]
    vertices = np.array(rows, np.float64).reshape(-1, 3)
    rows_i = [_triangle(t, f"{p}.indices[{i}]", len(verts)) for i, t in enumerate(tris)]
    indices = np.array(rows_i, np.int64).reshape(-1, 3)
    if np.abs(vertices * scale + np.array(translate)).max() > s.MAX_COORD:
        raise SceneError(f"{p}.vertices must lie within ±{s.MAX_COORD:g} after scale/translate")
    vertices.flags.writeable = False
    indices.flags.writeable = False
    material = _material_ref(d["material"], f"{p}.material", names)
    return s.Mesh(vertices, indices, material, scale, translate)


def _triangle(value: object, path: str, nverts: int) -> tuple[int, int, int]:
    if not isinstance(value, list) or len(value) != 3:
        raise SceneError(f"{path} must be a list of 3 vertex indices")
    for i, k in enumerate(value):
        if isinstance(k, bool) or not isinstance(k, int):
            raise SceneError(f"{path}[{i}] must be an integer")
        if not 0 <= k < nverts:
            raise SceneError(f"{path}[{i}] must be >= 0 and < {nverts} (the vertex count)")
    return (value[0], value[1], value[2])
