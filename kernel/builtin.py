"""Built-in scenes, addressable by name. Each is generated deterministically from code (no RNG
library: a local splitmix64), so a name always means the same document."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from kernel.scene import SceneError

BUILTIN_SCENES: tuple[str, ...] = ("cornell", "spheres", "mesh")


def builtin_scene(name: str) -> dict[str, Any]:
    """A fresh copy of the built-in scene document ``name`` (one of :data:`BUILTIN_SCENES`)."""
    makers: dict[str, Callable[[], dict[str, Any]]] = {
        "cornell": _cornell,
        "spheres": _spheres,
        "mesh": _mesh,
    }
    if name not in makers:
        raise SceneError(f"scene name must be one of {', '.join(BUILTIN_SCENES)} (got {name!r})")
    return makers[name]()


def _diffuse(r: float, g: float, b: float) -> dict[str, Any]:
    return {"type": "diffuse", "color": [r, g, b]}


def _cornell() -> dict[str, Any]:
    """smallpt's scene: nine spheres (the walls have radius 1e5), its camera and near plane."""
    wall = 1e5

    def sphere(radius: float, center: list[float], material: str) -> dict[str, Any]:
        return {"center": center, "radius": radius, "material": material}

    return {
        "version": 1,
        "camera": {
            "position": [50.0, 52.0, 295.6],
            "look_at": [50.0, 52.0 - 0.042612, 295.6 - 1.0],
            "up": [0.0, 1.0, 0.0],
            "vfov": math.degrees(2.0 * math.atan(0.5135)),
            "near": 140.0,
            "orbit": {
                "center": [50.0, 40.8, 81.6],
                "axis": [0.0, 1.0, 0.0],
                "degrees_per_frame": 0.5,
            },
        },
        "sky": [0.0, 0.0, 0.0],
        "materials": {
            "red": _diffuse(0.75, 0.25, 0.25),
            "blue": _diffuse(0.25, 0.25, 0.75),
            "white": _diffuse(0.75, 0.75, 0.75),
            "black": _diffuse(0.0, 0.0, 0.0),
            "mirror": {"type": "metal", "color": [0.999, 0.999, 0.999], "roughness": 0.0},
            "glass": {"type": "dielectric", "color": [0.999, 0.999, 0.999], "ior": 1.5},
            "light": {"type": "emissive", "emission": [12.0, 12.0, 12.0]},
        },
        "spheres": [
            sphere(wall, [wall + 1, 40.8, 81.6], "red"),
            sphere(wall, [-wall + 99, 40.8, 81.6], "blue"),
            sphere(wall, [50.0, 40.8, wall], "white"),
            sphere(wall, [50.0, 40.8, -wall + 170], "black"),
            sphere(wall, [50.0, wall, 81.6], "white"),
            sphere(wall, [50.0, -wall + 81.6, 81.6], "white"),
            sphere(16.5, [27.0, 16.5, 47.0], "mirror"),
            sphere(16.5, [73.0, 16.5, 78.0], "glass"),
            sphere(600.0, [50.0, 681.6 - 0.27, 81.6], "light"),
        ],
    }


def _uniforms(seed: int) -> Iterator[float]:
    """splitmix64 → doubles in [0, 1); fixed forever so the generated scenes never drift."""
    mask = (1 << 64) - 1
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        yield ((z ^ (z >> 31)) >> 11) / float(1 << 53)


def _spheres() -> dict[str, Any]:
    """A ground sphere and a jittered 9x9 grid of small random spheres (seed 2024)."""
    rnd = _uniforms(2024)
    materials: dict[str, Any] = {"ground": _diffuse(0.5, 0.5, 0.5)}
    for k in range(8):
        materials[f"paint{k}"] = _diffuse(*(round(0.1 + 0.8 * next(rnd), 4) for _ in range(3)))
    for k in range(3):
        color = [round(0.5 + 0.5 * next(rnd), 4) for _ in range(3)]
        materials[f"metal{k}"] = {"type": "metal", "color": color, "roughness": 0.15 * k}
    materials["glass"] = {"type": "dielectric", "color": [1.0, 1.0, 1.0], "ior": 1.5}
    names = sorted(materials)
    names.remove("ground")
    spheres: list[dict[str, Any]] = [
        {"center": [0.0, -1000.0, 0.0], "radius": 1000.0, "material": "ground"}
    ]
    for a in range(-4, 5):
        for b in range(-4, 5):
            x, z = a * 1.2 + 0.8 * next(rnd), b * 1.2 + 0.8 * next(rnd)
            radius = round(0.15 + 0.2 * next(rnd), 4)
            material = names[min(int(next(rnd) * len(names)), len(names) - 1)]
            spheres.append(
                {
                    "center": [round(x, 4), radius, round(z, 4)],
                    "radius": radius,
                    "material": material,
                }
            )
    spheres.append({"center": [0.0, 1.0, 0.0], "radius": 1.0, "material": "glass"})
    return {
        "version": 1,
        "camera": {
            "position": [9.0, 2.5, 6.0],
            "look_at": [0.0, 0.3, 0.0],
            "vfov": 35.0,
            "aperture": 0.08,
            "orbit": {"center": [0.0, 0.0, 0.0], "axis": [0.0, 1.0, 0.0], "degrees_per_frame": 2.0},
        },
        "sky": [0.7, 0.8, 1.0],
        "materials": materials,
        "spheres": spheres,
    }


def _knot(segments: int = 120, sides: int = 10) -> tuple[list[list[float]], list[list[int]]]:
    """A (2, 3) torus-knot tube: segments x sides quads, two triangles each, outward winding."""

    def curve(t: float) -> tuple[float, float, float]:
        r = 2.0 + math.cos(3.0 * t)
        return (r * math.cos(2.0 * t), -math.sin(3.0 * t), r * math.sin(2.0 * t))

    vertices: list[list[float]] = []
    for i in range(segments):
        t = 2.0 * math.pi * i / segments
        c, a, b = curve(t), curve(t - 1e-4), curve(t + 1e-4)
        tx, ty, tz = (b[k] - a[k] for k in range(3))
        nx, ny, nz = -tz, 0.0, tx  # tangent x (0, 1, 0): never zero for this knot
        nl = math.hypot(nx, nz)
        nx, nz = nx / nl, nz / nl
        tl = math.sqrt(tx * tx + ty * ty + tz * tz)
        bx, by, bz = (ty * nz - tz * ny) / tl, (tz * nx - tx * nz) / tl, (tx * ny - ty * nx) / tl
        for j in range(sides):
            phi = 2.0 * math.pi * j / sides
            cs, sn = 0.45 * math.cos(phi), 0.45 * math.sin(phi)
            vertices.append(
                [
                    round(c[k] + cs * n + sn * m, 6)
                    for k, n, m in zip(range(3), (nx, ny, nz), (bx, by, bz), strict=True)
                ]
            )
    indices: list[list[int]] = []
    for i in range(segments):
        for j in range(sides):
            a0, a1 = i * sides + j, i * sides + (j + 1) % sides
            b0, b1 = (
                ((i + 1) % segments) * sides + j,
                ((i + 1) % segments) * sides + (j + 1) % sides,
            )
            indices += [[a0, b0, b1], [a0, b1, a1]]
    return vertices, indices


def _mesh() -> dict[str, Any]:
    """A metal torus knot (2400 triangles, through the BVH) over a triangle floor."""
    vertices, indices = _knot()
    floor = [[-20.0, 0.0, -20.0], [20.0, 0.0, -20.0], [20.0, 0.0, 20.0], [-20.0, 0.0, 20.0]]
    return {
        "version": 1,
        "camera": {
            "position": [0.0, 4.0, 9.0],
            "look_at": [0.0, 1.6, 0.0],
            "vfov": 40.0,
            "orbit": {"center": [0.0, 0.0, 0.0], "axis": [0.0, 1.0, 0.0], "degrees_per_frame": 3.0},
        },
        "sky": [0.25, 0.3, 0.4],
        "materials": {
            "gold": {"type": "metal", "color": [0.9, 0.7, 0.3], "roughness": 0.2},
            "floor": _diffuse(0.6, 0.6, 0.6),
            "glass": {"type": "dielectric", "color": [1.0, 1.0, 1.0], "ior": 1.5},
            "lamp": {"type": "emissive", "emission": [10.0, 9.0, 8.0]},
        },
        "spheres": [
            {"center": [2.6, 0.7, 2.2], "radius": 0.7, "material": "glass"},
            {"center": [-3.0, 7.0, 3.0], "radius": 1.5, "material": "lamp"},
        ],
        "meshes": [
            {
                "vertices": vertices,
                "indices": indices,
                "material": "gold",
                "translate": [0.0, 1.7, 0.0],
            },
            {"vertices": floor, "indices": [[0, 2, 1], [0, 3, 2]], "material": "floor"},
        ],
    }
