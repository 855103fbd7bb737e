"""The path-tracing hot loop (numba).

The geometry arguments ``sph, tri, tn, bb, nodes, mat`` are the flat arrays built by
:mod:`kernel.flatten` (spheres, triangles, triangle normals, BVH boxes, BVH nodes, materials
with the sky as an extra last row). They are passed one by one rather than as a tuple: pulling
arrays out of a tuple inside the hot loop costs atomic reference-count updates.

Every sample of every pixel is computed by the same :func:`render_pixel`, whose random numbers
are a pure function of (seed, pixel, sample, dimension), and its contribution is added to the
accumulator in sample order. Serial, parallel and tiled renders therefore agree bit for bit.
The camera model and light transport follow smallpt (2x2 subpixels with a tent filter, the
same dielectric Fresnel split, Russian roulette after five bounces) so the ``cornell`` scene is
directly comparable with the C++ original.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from kernel._jit import jit_inline, jit_noalloc, jit_parallel
from kernel.bsdf import DIFFUSE, EMISSIVE, METAL, dielectric, diffuse, metal
from kernel.intersect import MISS, hit_spheres, hit_triangles
from kernel.rng import pixel_key, sample_key, uniform

RR_DEPTH = 5
"""Russian roulette starts after this many bounces, as in smallpt."""
STACK_SIZE = 128
_DIMS_PER_BOUNCE = 4
_TWO_PI = 2.0 * math.pi
_ROW_STRIDE = 8209
"""A prime above the maximum image height: k * 8209 % rows permutes the rows of any rect."""


@jit_inline
def _tent(u: float) -> float:
    r = 2.0 * u
    return math.sqrt(r) - 1.0 if r < 1.0 else 1.0 - math.sqrt(2.0 - r)


@jit_inline
def camera_ray(
    cam: np.ndarray, width: int, height: int, x: int, y: int, sample: int, key: np.uint64
) -> tuple[float, float, float, float, float, float]:
    """Primary ray (origin, unit direction) for one sample of pixel (x, y); row 0 is the top.

    ``cam`` = (origin, forward, right*tan·aspect, up*tan, lens radius, focus distance, near,
    right, up). The ray starts ``near`` units along itself, which is how smallpt (as g++
    evaluates ``Ray(cam.o + d * 140, d.norm())``: the argument normalising ``d`` first) places
    its camera behind the Cornell box's front wall.
    """
    sub = sample & 3
    fx = (((sub & 1) + 0.5 + _tent(uniform(key, 0))) / 2.0 + x) / width - 0.5
    fy = (((sub >> 1) + 0.5 + _tent(uniform(key, 1))) / 2.0 + (height - 1 - y)) / height - 0.5
    dx = cam[6] * fx + cam[9] * fy + cam[3]
    dy = cam[7] * fx + cam[10] * fy + cam[4]
    dz = cam[8] * fx + cam[11] * fy + cam[5]
    ox, oy, oz = cam[0], cam[1], cam[2]
    if cam[12] > 0.0:
        rad = cam[12] * math.sqrt(uniform(key, 2))
        phi = _TWO_PI * uniform(key, 3)
        lx = rad * math.cos(phi)
        ly = rad * math.sin(phi)
        f = cam[13]
        lox = ox + cam[15] * lx + cam[18] * ly
        loy = oy + cam[16] * lx + cam[19] * ly
        loz = oz + cam[17] * lx + cam[20] * ly
        dx, dy, dz = (ox + dx * f - lox) / f, (oy + dy * f - loy) / f, (oz + dz * f - loz) / f
        ox, oy, oz = lox, loy, loz
    inv = 1.0 / math.sqrt(dx * dx + dy * dy + dz * dz)
    dx, dy, dz = dx * inv, dy * inv, dz * inv
    near = cam[14]
    return ox + dx * near, oy + dy * near, oz + dz * near, dx, dy, dz


@jit_inline
def _nearest(
    sph: np.ndarray,
    tri: np.ndarray,
    tn: np.ndarray,
    bb: np.ndarray,
    nodes: np.ndarray,
    stack: np.ndarray,
    ox: float,
    oy: float,
    oz: float,
    dx: float,
    dy: float,
    dz: float,
) -> tuple[float, float, float, float, int]:
    """Nearest hit as (t, outward normal, material); material -1 on a miss."""
    t, si = hit_spheres(sph, ox, oy, oz, dx, dy, dz, MISS)
    t, ti = hit_triangles(tri, bb, nodes, stack, ox, oy, oz, dx, dy, dz, t)
    if ti >= 0:
        return t, tn[ti, 0], tn[ti, 1], tn[ti, 2], int(tn[ti, 3])
    if si >= 0:
        k = sph[si, 4]
        nx = (ox + dx * t - sph[si, 0]) * k
        ny = (oy + dy * t - sph[si, 1]) * k
        nz = (oz + dz * t - sph[si, 2]) * k
        return t, nx, ny, nz, int(sph[si, 5])
    return t, 0.0, 0.0, 0.0, -1


@jit_inline
def radiance(
    sph: np.ndarray,
    tri: np.ndarray,
    tn: np.ndarray,
    bb: np.ndarray,
    nodes: np.ndarray,
    mat: np.ndarray,
    stack: np.ndarray,
    key: np.uint64,
    max_depth: int,
    ox: float,
    oy: float,
    oz: float,
    dx: float,
    dy: float,
    dz: float,
) -> tuple[float, float, float]:
    """Radiance along one camera ray: smallpt's recursion unrolled into a loop.

    Long because it is the hot loop: splitting it further costs registers, not clarity.
    """
    lr = lg = lb = 0.0
    tr = tg = tb = 1.0
    for depth in range(1, max_depth + 1):
        t, nx, ny, nz, m = _nearest(sph, tri, tn, bb, nodes, stack, ox, oy, oz, dx, dy, dz)
        if m < 0:
            lr += tr * mat[-1, 4]
            lg += tg * mat[-1, 5]
            lb += tb * mat[-1, 6]
            break
        ox, oy, oz = ox + dx * t, oy + dy * t, oz + dz * t
        kind = int(mat[m, 0])
        if kind == EMISSIVE:
            lr += tr * mat[m, 4]
            lg += tg * mat[m, 5]
            lb += tb * mat[m, 6]
            break
        fr, fg, fb = mat[m, 1], mat[m, 2], mat[m, 3]
        p = max(fr, fg, fb)
        dim = 4 + _DIMS_PER_BOUNCE * depth
        if p <= 0.0:
            break
        if depth > RR_DEPTH:
            if uniform(key, dim) >= p:
                break
            inv_p = 1.0 / p
            fr, fg, fb = fr * inv_p, fg * inv_p, fb * inv_p
        into = nx * dx + ny * dy + nz * dz < 0.0
        if kind == DIFFUSE:
            if not into:
                nx, ny, nz = -nx, -ny, -nz
            dx, dy, dz = diffuse(nx, ny, nz, uniform(key, dim + 1), uniform(key, dim + 2))
        elif kind == METAL:
            dx, dy, dz = metal(dx, dy, dz, nx, ny, nz, mat[m, 7], key, dim + 1)
            if (dx * nx + dy * ny + dz * nz < 0.0) == into:
                break
        else:
            dx, dy, dz, w = dielectric(
                dx, dy, dz, nx, ny, nz, into, mat[m, 7], uniform(key, dim + 1)
            )
            fr, fg, fb = fr * w, fg * w, fb * w
        tr, tg, tb = tr * fr, tg * fg, tb * fb
    return lr, lg, lb


@jit_inline
def render_pixel(
    sph: np.ndarray,
    tri: np.ndarray,
    tn: np.ndarray,
    bb: np.ndarray,
    nodes: np.ndarray,
    mat: np.ndarray,
    cam: np.ndarray,
    stack: np.ndarray,
    params: np.ndarray,
    x: int,
    y: int,
    s0: int,
    s1: int,
    acc: np.ndarray,
    ay: int,
    ax: int,
) -> None:
    """Add samples [s0, s1) of pixel (x, y) to ``acc[ay, ax]``, one sample at a time.

    ``params`` = (width, height, max_depth, seed, frame) as int64.
    """
    width = params[0]
    pkey = pixel_key(params[3], params[4], y * width + x)
    for s in range(s0, s1):
        key = sample_key(pkey, s)
        ox, oy, oz, dx, dy, dz = camera_ray(cam, width, params[1], x, y, s, key)
        r, g, b = radiance(
            sph, tri, tn, bb, nodes, mat, stack, key, params[2], ox, oy, oz, dx, dy, dz
        )
        acc[ay, ax, 0] += r
        acc[ay, ax, 1] += g
        acc[ay, ax, 2] += b


@jit_noalloc
def render_row(
    sph: np.ndarray,
    tri: np.ndarray,
    tn: np.ndarray,
    bb: np.ndarray,
    nodes: np.ndarray,
    mat: np.ndarray,
    cam: np.ndarray,
    params: np.ndarray,
    rect: np.ndarray,
    j: int,
    s0: int,
    s1: int,
    acc: np.ndarray,
    stack: np.ndarray,
) -> None:
    """Render row ``j`` of rect = (x0, y0, x1, y1) into ``acc[j]``.

    The one compiled copy of the per-pixel loop: the serial and parallel drivers both call it,
    so they run the same machine code. ``stack`` is int64 BVH scratch of :data:`STACK_SIZE`.
    """
    y = rect[1] + j
    for i in range(rect[2] - rect[0]):
        render_pixel(
            sph, tri, tn, bb, nodes, mat, cam, stack, params, rect[0] + i, y, s0, s1, acc, j, i
        )


@jit_noalloc
def render_rect(
    sph: np.ndarray,
    tri: np.ndarray,
    tn: np.ndarray,
    bb: np.ndarray,
    nodes: np.ndarray,
    mat: np.ndarray,
    cam: np.ndarray,
    params: np.ndarray,
    rect: np.ndarray,
    s0: int,
    s1: int,
    acc: np.ndarray,
    stack: np.ndarray,
) -> None:
    """Serial render of rect = (x0, y0, x1, y1) into acc[y - y0, x - x0]."""
    for j in range(rect[3] - rect[1]):
        render_row(sph, tri, tn, bb, nodes, mat, cam, params, rect, j, s0, s1, acc, stack)


@jit_parallel
def render_rect_parallel(
    sph: np.ndarray,
    tri: np.ndarray,
    tn: np.ndarray,
    bb: np.ndarray,
    nodes: np.ndarray,
    mat: np.ndarray,
    cam: np.ndarray,
    params: np.ndarray,
    rect: np.ndarray,
    s0: int,
    s1: int,
    acc: np.ndarray,
) -> None:
    """:func:`render_rect` with rows spread over threads (a fixed permutation balances load)."""
    rows = rect[3] - rect[1]
    for k in prange(rows):
        j = (k * _ROW_STRIDE) % rows
        stack = np.empty(STACK_SIZE, np.int64)
        render_row(sph, tri, tn, bb, nodes, mat, cam, params, rect, j, s0, s1, acc, stack)
