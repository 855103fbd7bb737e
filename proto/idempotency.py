"""Idempotency keys and request fingerprints.

The **idempotency key** names the logical request: sha256 of canonical JSON
(:mod:`proto.canonical`) of the project, the scene's content hash, the frame and every render
setting (width, height, spp, tile_size, max_depth, seed). ``tile_size`` is part of it because it
decides the tile plan, although the pixels would be the same. A client-supplied key is scoped to
its project and hashed too, so every stored key is 64 hex characters and a client key can never
collide with a derived one.

The **fingerprint** is the hash of the whole normalised request (defaults applied), stored next
to the key: the same key arriving with a different fingerprint is a ``conflict``, never a silent
reuse. With a derived key the two always agree. ``priority`` and ``deadline`` are in neither
(:data:`SCHEDULING_FIELDS`).
"""

from __future__ import annotations

from typing import Any

from proto.api import SubmitRequest
from proto.canonical import canonical_hash
from proto.limits import Scene
from proto.names import RENDERER_TESSERA

KEY_VERSION = 1
SCHEDULING_FIELDS = ("priority", "deadline")
"""Submit fields that say when to render, not what: neither in the key nor in the fingerprint
(a repeat with another priority or deadline returns the job as it is; ``tessera priority``
changes it)."""


def scene_hash(scene: Scene) -> str:
    """Content hash of a scene: the builtin's name or the inline document's canonical JSON."""
    if isinstance(scene, str):
        return canonical_hash({"builtin": scene})
    return canonical_hash({"inline": scene})


def _settings(request: SubmitRequest) -> dict[str, Any]:
    names = ("width", "height", "spp", "tile_size", "max_depth", "seed")
    return {name: getattr(request, name) for name in names}


def cost_key(request: SubmitRequest) -> str:
    """What a pixel-sample of this request costs depends on: renderer, scene and bounces. The
    scheduler sizes ``tile_size: "auto"`` tiles from the finished tiles of earlier jobs with the
    same key (the image size, spp, frame and seed change how many samples, not their cost)."""
    return canonical_hash(
        {
            "kind": "tessera.cost",
            "renderer": request.renderer,
            "scene": scene_hash(request.scene),
            "max_depth": request.max_depth,
        }
    )


def derived_idempotency_key(request: SubmitRequest) -> str:
    """The key Tessera derives from the request's logical identity."""
    identity = {
        "kind": "tessera.idempotency",
        "v": KEY_VERSION,
        "project": request.project,
        "scene": scene_hash(request.scene),
        "frame": request.frame,
        "settings": _settings(request),
    }
    if request.renderer != RENDERER_TESSERA:  # (a tessera job's key is what it was before)
        identity["renderer"] = request.renderer
    return canonical_hash(identity)


def idempotency_key(request: SubmitRequest) -> str:
    """The stored key: derived, or the client's own key scoped to its project."""
    if request.idempotency_key is None:
        return derived_idempotency_key(request)
    scoped = {"kind": "tessera.client-key", "v": KEY_VERSION, "project": request.project}
    return canonical_hash({**scoped, "key": request.idempotency_key})


def request_fingerprint(request: SubmitRequest) -> str:
    """Hash of the whole normalised request body (the key itself excluded)."""
    body = request.to_body()
    for scheduling in ("idempotency_key", *SCHEDULING_FIELDS):
        body.pop(scheduling, None)
    body["scene"] = scene_hash(request.scene)
    return canonical_hash({"kind": "tessera.fingerprint", "v": KEY_VERSION, "body": body})
