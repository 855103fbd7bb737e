"""Ray–scene intersection over the flat arrays built by :mod:`kernel.flatten`.

Spheres are tested linearly (scenes have few, and smallpt's walls are spheres of radius 1e5 that
would make any bounding-volume hierarchy useless); triangles go through a BVH. Scalars are
passed and returned instead of small arrays so numba keeps everything in registers.
"""

from __future__ import annotations

import math

import numpy as np

from kernel._jit import jit_inline

EPS = 1e-4
"""Minimum hit distance, as in smallpt; it also keeps a bounced ray off its own surface."""
MISS = 1e20

HIT_NONE = -1
HIT_SPHERE = 0
HIT_TRIANGLE = 1


@jit_inline
def hit_spheres(
    sph: np.ndarray, ox: float, oy: float, oz: float, dx: float, dy: float, dz: float, tmax: float
) -> tuple[float, int]:
    """Nearest sphere hit closer than ``tmax``: (t, index), index -1 when none.

    ``sph`` rows are (cx, cy, cz, radius², 1/radius, material).
    """
    best = tmax
    hit = -1
    for i in range(sph.shape[0]):
        px = sph[i, 0] - ox
        py = sph[i, 1] - oy
        pz = sph[i, 2] - oz
        b = px * dx + py * dy + pz * dz
        det = b * b - (px * px + py * py + pz * pz) + sph[i, 3]
        if det < 0.0:
            continue
        sd = math.sqrt(det)
        t = b - sd
        if t <= EPS:
            t = b + sd
            if t <= EPS:
                continue
        if t < best:
            best = t
            hit = i
    return best, hit


@jit_inline
def _box_entry(
    bb: np.ndarray, i: int, ox: float, oy: float, oz: float, ix: float, iy: float, iz: float
) -> float:
    """Distance at which the ray enters box ``i`` (slab test), or MISS."""
    t0x = (bb[i, 0] - ox) * ix
    t1x = (bb[i, 3] - ox) * ix
    t0y = (bb[i, 1] - oy) * iy
    t1y = (bb[i, 4] - oy) * iy
    t0z = (bb[i, 2] - oz) * iz
    t1z = (bb[i, 5] - oz) * iz
    tmin = max(min(t0x, t1x), min(t0y, t1y), min(t0z, t1z))
    tmax = min(max(t0x, t1x), max(t0y, t1y), max(t0z, t1z))
    if tmax < max(tmin, 0.0):
        return MISS
    entry: float = tmin
    return entry


@jit_inline
def _hit_leaf(
    tri: np.ndarray,
    first: int,
    count: int,
    ox: float,
    oy: float,
    oz: float,
    dx: float,
    dy: float,
    dz: float,
    best: float,
    hit: int,
) -> tuple[float, int]:
    """Möller–Trumbore over triangles first..first+count; rows are (v0, edge1, edge2)."""
    for k in range(first, first + count):
        e1x, e1y, e1z = tri[k, 3], tri[k, 4], tri[k, 5]
        e2x, e2y, e2z = tri[k, 6], tri[k, 7], tri[k, 8]
        qx = dy * e2z - dz * e2y
        qy = dz * e2x - dx * e2z
        qz = dx * e2y - dy * e2x
        det = e1x * qx + e1y * qy + e1z * qz
        if abs(det) < 1e-14:
            continue
        inv = 1.0 / det
        sx = ox - tri[k, 0]
        sy = oy - tri[k, 1]
        sz = oz - tri[k, 2]
        u = (sx * qx + sy * qy + sz * qz) * inv
        if u < 0.0 or u > 1.0:
            continue
        rx = sy * e1z - sz * e1y
        ry = sz * e1x - sx * e1z
        rz = sx * e1y - sy * e1x
        v = (dx * rx + dy * ry + dz * rz) * inv
        if v < 0.0 or u + v > 1.0:
            continue
        t = (e2x * rx + e2y * ry + e2z * rz) * inv
        if EPS < t < best:
            best = t
            hit = k
    return best, hit


@jit_inline
def hit_triangles(
    tri: np.ndarray,
    bb: np.ndarray,
    nodes: np.ndarray,
    stack: np.ndarray,
    ox: float,
    oy: float,
    oz: float,
    dx: float,
    dy: float,
    dz: float,
    tmax: float,
) -> tuple[float, int]:
    """Nearest triangle hit closer than ``tmax`` via the BVH: (t, index), index -1 when none.

    ``nodes[i] = (a, count)``: a leaf holds triangles a..a+count; an inner node (count 0) has
    its left child at i + 1 and its right child at a. ``stack`` is caller-provided scratch.
    """
    best = tmax
    hit = -1
    if nodes.shape[0] == 0:
        return best, hit
    ix = 1.0 / dx
    iy = 1.0 / dy
    iz = 1.0 / dz
    top = 0
    stack[0] = 0
    while top >= 0:
        node = stack[top]
        top -= 1
        if _box_entry(bb, node, ox, oy, oz, ix, iy, iz) >= best:
            continue
        count = nodes[node, 1]
        if count > 0:
            best, hit = _hit_leaf(tri, nodes[node, 0], count, ox, oy, oz, dx, dy, dz, best, hit)
        else:
            stack[top + 1] = nodes[node, 0]
            stack[top + 2] = node + 1
            top += 2
    return best, hit
