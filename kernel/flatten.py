"""Validated scene + frame + settings → the flat arrays the tracer reads (:class:`Prepared`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernel.bsdf import DIELECTRIC, DIFFUSE, EMISSIVE, METAL
from kernel.bvh import build_bvh
from kernel.camera import camera_array
from kernel.scene import Material, Scene
from kernel.settings import RenderSettings, check_frame
from kernel.validate import validate_scene

_KINDS = {"diffuse": DIFFUSE, "metal": METAL, "dielectric": DIELECTRIC, "emissive": EMISSIVE}


@dataclass(frozen=True, eq=False)
class Prepared:
    """Everything needed to render one frame; immutable and safe to share between threads.

    ``spheres`` (n, 6): centre, radius², 1/radius, material. ``triangles`` (m, 9): v0, edge1,
    edge2 in BVH order; ``normals`` (m, 4): unit face normal, material. ``boxes``/``nodes``: the
    BVH. ``materials`` (k + 1, 8): kind, colour, emission, roughness-or-ior, with the sky as the
    last row's emission. ``camera``: see :func:`kernel.camera.camera_array`. ``params``: width,
    height, max_depth, seed, frame.
    """

    scene: Scene
    frame: int
    settings: RenderSettings
    spheres: np.ndarray
    triangles: np.ndarray
    normals: np.ndarray
    boxes: np.ndarray
    nodes: np.ndarray
    materials: np.ndarray
    camera: np.ndarray
    params: np.ndarray

    def geometry(self) -> tuple[np.ndarray, ...]:
        """The geometry arguments of :func:`kernel.trace.render_rect`, in order."""
        return (self.spheres, self.triangles, self.normals, self.boxes, self.nodes, self.materials)


def prepare(doc: dict[str, Any], frame: int, settings: RenderSettings) -> Prepared:
    """Validate ``doc``, ``frame`` and ``settings`` and build the arrays for that frame."""
    scene = validate_scene(doc)
    frame = check_frame(frame)
    settings.validate()
    index = {m.name: i for i, m in enumerate(scene.materials)}
    triangles, normals, boxes, nodes = _triangles(scene, index)
    arrays = {
        "spheres": _spheres(scene, index),
        "triangles": triangles,
        "normals": normals,
        "boxes": boxes,
        "nodes": nodes,
        "materials": _materials(scene.materials, scene.sky),
        "camera": camera_array(scene.camera, frame, settings.width, settings.height),
        "params": np.array(
            [settings.width, settings.height, settings.max_depth, settings.seed, frame], np.int64
        ),
    }
    for a in arrays.values():
        a.flags.writeable = False
    return Prepared(scene=scene, frame=frame, settings=settings, **arrays)


def _spheres(scene: Scene, index: dict[str, int]) -> np.ndarray:
    out = np.zeros((len(scene.spheres), 6), np.float64)
    for i, s in enumerate(scene.spheres):
        out[i] = (*s.center, s.radius * s.radius, 1.0 / s.radius, index[s.material])
    return out


def _materials(materials: tuple[Material, ...], sky: tuple[float, float, float]) -> np.ndarray:
    out = np.zeros((len(materials) + 1, 8), np.float64)
    for i, m in enumerate(materials):
        param = m.ior if m.kind == "dielectric" else m.roughness
        out[i] = (_KINDS[m.kind], *m.color, *m.emission, param)
    out[-1, 0] = EMISSIVE
    out[-1, 4:7] = sky
    return out


def _triangles(
    scene: Scene, index: dict[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    corners = [m.vertices[m.indices] * m.scale + np.array(m.translate) for m in scene.meshes]
    mats = [np.full(len(m.indices), index[m.material], np.float64) for m in scene.meshes]
    tris = np.concatenate(corners) if corners else np.zeros((0, 3, 3))
    mat = np.concatenate(mats) if mats else np.zeros(0)
    order, boxes, nodes = build_bvh(tris)
    tris, mat = tris[order], mat[order]
    e1 = tris[:, 1] - tris[:, 0]
    e2 = tris[:, 2] - tris[:, 0]
    n = np.cross(e1, e2)
    length = np.linalg.norm(n, axis=1, keepdims=True)
    n = np.divide(n, length, out=np.zeros_like(n), where=length > 0.0)
    packed = np.ascontiguousarray(np.concatenate([tris[:, 0], e1, e2], axis=1))
    normals = np.ascontiguousarray(np.concatenate([n, mat[:, None]], axis=1))
    return packed, normals, boxes, nodes
