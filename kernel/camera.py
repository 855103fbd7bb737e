"""Camera animation and the flat camera array the tracer reads.

The image plane follows smallpt: a primary ray's unnormalised direction is
``forward + right·tan(vfov/2)·aspect·(fx - ½) + up·tan(vfov/2)·(fy - ½)``, so with
``near = 140`` and smallpt's position and direction the ``cornell`` scene sees exactly what the
C++ original sees.
"""

from __future__ import annotations

import math

import numpy as np

from kernel.scene import Camera, Vec3

CAMERA_FLOATS = 21


def animated(camera: Camera, frame: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position, look_at, up) at ``frame``: the orbit rotates all three rigidly."""
    pos, look, up = (np.array(v, np.float64) for v in (camera.position, camera.look_at, camera.up))
    if camera.orbit is None or frame == 0:
        return pos, look, up
    orbit = camera.orbit
    angle = math.radians((frame * orbit.degrees_per_frame) % 360.0)
    rot = _rotation(orbit.axis, angle)
    center = np.array(orbit.center, np.float64)
    return center + rot @ (pos - center), center + rot @ (look - center), rot @ up


def _rotation(axis: Vec3, angle: float) -> np.ndarray:
    """Rodrigues' rotation matrix about a (not necessarily unit) axis."""
    k = np.array(axis, np.float64) / np.linalg.norm(axis)
    cross = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    rot: np.ndarray = (
        np.eye(3) + math.sin(angle) * cross + (1.0 - math.cos(angle)) * (cross @ cross)
    )
    return rot


def camera_array(camera: Camera, frame: int, width: int, height: int) -> np.ndarray:
    """The 21 floats :func:`kernel.trace.camera_ray` reads for this frame and image size."""
    pos, look, up = animated(camera, frame)
    forward = _unit(look - pos)
    right = _unit(np.cross(forward, up))
    cam_up = _unit(np.cross(right, forward))
    tan_half = math.tan(math.radians(camera.vfov) / 2.0)
    focus = camera.focus_distance
    if focus is None:
        focus = float(np.linalg.norm(look - pos))
    out = np.empty(CAMERA_FLOATS, np.float64)
    out[0:3] = pos
    out[3:6] = forward
    out[6:9] = right * (tan_half * width / height)
    out[9:12] = cam_up * tan_half
    out[12] = camera.aperture / 2.0
    out[13] = focus
    out[14] = camera.near
    out[15:18] = right
    out[18:21] = cam_up
    return out


def _unit(v: np.ndarray) -> np.ndarray:
    result: np.ndarray = v / np.linalg.norm(v)
    return result
