"""Scene checks before anything is written: builtin lookup, kernel validation, input hash.

The kernel owns the scene format; the gateway only translates its verdict: an unknown builtin or
a :class:`kernel.SceneError` becomes :class:`~shared.core.errors.ValidationError` (reply
``invalid``) carrying the kernel's message, which names the field and the limit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import kernel.hashing  # numpy loads at start-up, not in the first submit
from proto.api import SubmitRequest
from proto.limits import Scene
from shared.core.errors import ValidationError

__all__ = ["CheckedScene", "check_submission", "check_submission_sync", "resolve_scene"]


@dataclass(frozen=True)
class CheckedScene:
    """A submission's scene document, validated, with the hash of everything that sets pixels."""

    doc: dict[str, Any]
    input_hash: str


def resolve_scene(scene: Scene) -> dict[str, Any]:
    """The scene document a request names: a builtin's document, or the inline one as is."""
    if isinstance(scene, dict):
        return scene
    known = sorted(kernel.BUILTIN_SCENES)
    if scene not in known:
        raise ValidationError(f"scene: unknown builtin {scene!r:.80} (known: {', '.join(known)})")
    return kernel.builtin_scene(scene)


def _check(doc: dict[str, Any], request: SubmitRequest) -> str:
    settings = kernel.RenderSettings(
        width=request.width,
        height=request.height,
        spp=request.spp,
        max_depth=request.max_depth,
        seed=request.seed,
    )
    try:
        kernel.validate_scene(doc)
        settings.validate()
        return kernel.input_hash(doc, request.frame, settings)
    except kernel.SceneError as exc:
        raise ValidationError(f"scene: {exc}") from exc


def check_submission_sync(request: SubmitRequest) -> CheckedScene:
    """:func:`check_submission` in the caller's thread (a worker process's, for a large body)."""
    doc = resolve_scene(request.scene)
    return CheckedScene(doc, _check(doc, request))


async def check_submission(request: SubmitRequest) -> CheckedScene:
    """Resolve and validate ``request``'s scene; raise ValidationError if the kernel refuses it.

    Validation of a large inline mesh takes a while, so it runs off the event loop.
    """
    doc = resolve_scene(request.scene)
    input_hash = await asyncio.to_thread(_check, doc, request)
    return CheckedScene(doc, input_hash)
