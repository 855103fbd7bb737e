"""Scene checks before anything is written: builtin lookup, kernel validation, input hash.

A ``tessera`` job's input hash covers the renderer's name and :data:`kernel.KERNEL_VERSION`; a
``blender`` or ``povray`` job's covers the renderer's name and the scene reference, and each
worker mixes its renderer's version into every checkpoint
(:func:`kernel.hashing.checkpoint_hash`).

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


def _reference(request: SubmitRequest) -> CheckedScene | None:
    """The checked scene of a job of an external renderer (a reference, checked by the
    request's schema), hashed with the renderer's name; ``None`` for ``tessera``."""
    if request.renderer == kernel.hashing.KERNEL_RENDERER:
        return None
    assert isinstance(request.scene, dict)  # (SubmitRequest checked the reference)
    settings = {"width": request.width, "height": request.height, "spp": request.spp,
                "seed": request.seed, "max_depth": request.max_depth}  # fmt: skip
    doc = dict(request.scene)
    return CheckedScene(
        doc, kernel.hashing.reference_input_hash(request.renderer, doc, request.frame, settings)
    )


def check_submission_sync(request: SubmitRequest) -> CheckedScene:
    """:func:`check_submission` in the caller's thread (a worker process's, for a large body)."""
    if (ref := _reference(request)) is not None:
        return ref
    doc = resolve_scene(request.scene)
    return CheckedScene(doc, _check(doc, request))


async def check_submission(request: SubmitRequest) -> CheckedScene:
    """Resolve and validate ``request``'s scene; raise ValidationError if the kernel refuses it.

    Validation of a large inline mesh takes a while, so it runs off the event loop. A job of
    another renderer names an uploaded asset; its hash is the reference's (the manifest's
    sha256 covers every byte of the scene) with the renderer's name.
    """
    if (ref := _reference(request)) is not None:
        return ref
    doc = resolve_scene(request.scene)
    input_hash = await asyncio.to_thread(_check, doc, request)
    return CheckedScene(doc, input_hash)
