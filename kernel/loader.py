"""Scene files on disk → self-contained scene documents (the kernel's only file I/O).

``meshes[i].obj`` names a Wavefront OBJ file relative to the scene file; the loader replaces it
with inline ``vertices`` and ``indices`` so the returned document can travel over the queue and be
validated anywhere without access to the client's files.

:func:`read_scene_file` only reads and inlines (pure Python: the client-only install uses it and
leaves validation to the gateway); :func:`load_scene_file` also validates, which needs numpy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kernel.scene import MAX_TRIANGLES, MAX_VERTICES, SceneError

MAX_FILE_BYTES = 64 * 1024 * 1024
"""Largest scene or OBJ file the loader reads."""


def load_scene_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON scene file, inline its OBJ meshes and validate the result.

    Returns the self-contained document (a plain JSON-able dict); raises :class:`SceneError`
    for unreadable or invalid files.
    """
    from kernel.validate import validate_scene  # numpy: not needed to read a file

    doc = read_scene_file(path)
    validate_scene(doc)
    return doc


def read_scene_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON scene file and inline its OBJ meshes, without validating the document.

    Raises :class:`SceneError` for an unreadable file, invalid JSON, a document that is not a
    JSON object, or a bad OBJ file (syntax, or more vertices or triangles than the limits).
    """
    scene_path = Path(path)
    try:
        doc = json.loads(_read(scene_path, "scene file"))
    except json.JSONDecodeError as exc:
        raise SceneError(f"scene file {scene_path}: invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SceneError(f"scene file {scene_path}: the scene must be a JSON object")
    if isinstance(doc.get("meshes"), list):
        doc["meshes"] = [
            _inline(mesh, f"meshes[{i}]", scene_path.parent) for i, mesh in enumerate(doc["meshes"])
        ]
    return doc


def _read(path: Path, what: str) -> str:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise SceneError(f"{what} {path} must be at most {MAX_FILE_BYTES} bytes")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SceneError(f"{what} {path} cannot be read: {exc}") from None


def _inline(mesh: object, field: str, base: Path) -> object:
    if not isinstance(mesh, dict) or "obj" not in mesh:
        return mesh
    ref = mesh["obj"]
    if not isinstance(ref, str) or not ref:
        raise SceneError(f"{field}.obj must be a file path relative to the scene file")
    vertices, indices = parse_obj(_read(base / ref, f"{field}.obj"), f"{field}.obj ({ref})")
    out = {k: v for k, v in mesh.items() if k != "obj"}
    out["vertices"] = vertices
    out["indices"] = indices
    return out


def parse_obj(text: str, where: str) -> tuple[list[list[float]], list[list[int]]]:
    """Vertices and triangles of an OBJ text: ``v`` and ``f`` records, polygons as fans.

    Face corners may be ``i``, ``i/t``, ``i//n`` or ``i/t/n``; negative indices count back from
    the latest vertex. Normals, texture coordinates, groups and materials are ignored.
    """
    vertices: list[list[float]] = []
    indices: list[list[int]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or parts[0] not in ("v", "f"):
            continue
        if parts[0] == "v":
            vertices.append(_obj_vertex(parts[1:], f"{where} line {lineno}"))
            if len(vertices) > MAX_VERTICES:
                raise SceneError(f"{where} must have at most {MAX_VERTICES} vertices")
            continue
        corners = [_obj_corner(c, len(vertices), f"{where} line {lineno}") for c in parts[1:]]
        if len(corners) < 3:
            raise SceneError(f"{where} line {lineno}: a face needs at least 3 vertices")
        indices.extend([corners[0], corners[k], corners[k + 1]] for k in range(1, len(corners) - 1))
        if len(indices) > MAX_TRIANGLES:
            raise SceneError(f"{where} must have at most {MAX_TRIANGLES} triangles")
    return vertices, indices


def _obj_vertex(fields: list[str], where: str) -> list[float]:
    if len(fields) < 3:
        raise SceneError(f"{where}: a vertex needs 3 coordinates")
    try:
        return [float(x) for x in fields[:3]]
    except ValueError:
        raise SceneError(f"{where}: vertex coordinates must be numbers") from None


def _obj_corner(token: str, count: int, where: str) -> int:
    try:
        k = int(token.split("/")[0])
    except ValueError:
        raise SceneError(f"{where}: face index {token!r} must be an integer") from None
    index = k - 1 if k > 0 else count + k
    if k == 0 or not 0 <= index < count:
        raise SceneError(
            f"{where}: face index {k} must refer to one of the {count} vertices so far"
        )
    return index
