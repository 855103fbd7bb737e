"""Scattering functions: given the incoming direction and the surface normal, pick the next one.

All directions are unit vectors; normals are the outward geometric normal unless noted.
"""

from __future__ import annotations

import math

import numpy as np

from kernel._jit import jit_inline
from kernel.rng import uniform

DIFFUSE = 0
METAL = 1
DIELECTRIC = 2
EMISSIVE = 3
"""Material kinds as stored in column 0 of the materials array."""

_TWO_PI = 2.0 * math.pi


@jit_inline
def diffuse(nx: float, ny: float, nz: float, u1: float, u2: float) -> tuple[float, float, float]:
    """Cosine-weighted direction around unit normal n (orthonormal basis after Duff et al.)."""
    sign = math.copysign(1.0, nz)
    a = -1.0 / (sign + nz)
    b = nx * ny * a
    c = math.cos(_TWO_PI * u1)
    s = math.sqrt(max(0.0, 1.0 - c * c))
    if u1 > 0.5:
        s = -s
    r2s = math.sqrt(u2)
    p = c * r2s
    q = s * r2s
    w = math.sqrt(1.0 - u2)
    return (
        (1.0 + sign * nx * nx * a) * p + b * q + nx * w,
        sign * b * p + (sign + ny * ny * a) * q + ny * w,
        -sign * nx * p - ny * q + nz * w,
    )


@jit_inline
def dielectric(
    dx: float,
    dy: float,
    dz: float,
    nx: float,
    ny: float,
    nz: float,
    into: bool,
    ior: float,
    u: float,
) -> tuple[float, float, float, float]:
    """smallpt's glass: pick reflection or refraction by Fresnel; returns (direction, weight)."""
    dn = dx * nx + dy * ny + dz * nz
    rx, ry, rz = dx - 2.0 * dn * nx, dy - 2.0 * dn * ny, dz - 2.0 * dn * nz
    ddn = dn if into else -dn
    nnt = 1.0 / ior if into else ior
    cos2t = 1.0 - nnt * nnt * (1.0 - ddn * ddn)
    if cos2t < 0.0:
        return rx, ry, rz, 1.0
    k = ddn * nnt + math.sqrt(cos2t)
    if not into:
        k = -k
    tx, ty, tz = dx * nnt - nx * k, dy * nnt - ny * k, dz * nnt - nz * k
    inv = 1.0 / math.sqrt(tx * tx + ty * ty + tz * tz)
    tx, ty, tz = tx * inv, ty * inv, tz * inv
    a = ior - 1.0
    b = ior + 1.0
    r0 = a * a / (b * b)
    c = 1.0 - (-ddn if into else tx * nx + ty * ny + tz * nz)
    re = r0 + (1.0 - r0) * c * c * c * c * c
    p = 0.25 + 0.5 * re
    if u < p:
        return rx, ry, rz, re / p
    return tx, ty, tz, (1.0 - re) / (1.0 - p)


@jit_inline
def metal(
    dx: float,
    dy: float,
    dz: float,
    nx: float,
    ny: float,
    nz: float,
    rough: float,
    key: np.uint64,
    dim: int,
) -> tuple[float, float, float]:
    """Mirror reflection, perturbed by ``rough`` times a uniform unit vector."""
    dn = dx * nx + dy * ny + dz * nz
    rx, ry, rz = dx - 2.0 * dn * nx, dy - 2.0 * dn * ny, dz - 2.0 * dn * nz
    if rough > 0.0:
        z = 1.0 - 2.0 * uniform(key, dim)
        phi = _TWO_PI * uniform(key, dim + 1)
        r = math.sqrt(max(0.0, 1.0 - z * z))
        rx += rough * r * math.cos(phi)
        ry += rough * r * math.sin(phi)
        rz += rough * z
        inv = 1.0 / math.sqrt(rx * rx + ry * ry + rz * rz)
        rx, ry, rz = rx * inv, ry * inv, rz * inv
    return rx, ry, rz
