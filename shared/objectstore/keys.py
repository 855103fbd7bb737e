"""Object keys, built only from ids and digests (never from user text).

==========================  =============================================  ==================
builder                     key                                            written by
==========================  =============================================  ==================
:func:`checkpoint_key`      ``checkpoints/<job>/<tile>/<attempt>.npy``     one attempt (scoped)
:func:`tile_result_key`     ``tiles/<job>/<tile>/<sha256>.npy``            content-addressed
:func:`render_key`          ``renders/<job>/<sha256>.<png|npy>``           content-addressed
:func:`asset_chunk_key`     ``assets/chunks/<sha256>``                     content-addressed
:func:`asset_manifest_key`  ``assets/manifests/<sha256>``                  content-addressed
==========================  =============================================  ==================

Content-addressed keys make racing writers harmless: they write the same bytes.
"""

from __future__ import annotations

from proto.names import check_index, check_token
from shared.core.errors import ValidationError
from shared.objectstore.base import SHA256_RE, check_sha256

RENDER_EXTENSIONS = frozenset({"png", "npy"})


def checkpoint_key(job_id: str, tile_index: int, attempt_id: str, samples: int) -> str:
    """Key of one checkpoint of one tile: ``samples`` per pixel by one attempt.

    Every checkpoint gets a key of its own, never overwritten: a pointer names exactly the
    bytes of the samples it records, even when a crash lands between writing a new checkpoint
    and moving the pointer to it (the old one is deleted only after the pointer moved).
    """
    job = check_token(job_id, "job_id")
    tile = check_index(tile_index, "tile_index")
    attempt = check_token(attempt_id, "attempt_id")
    return f"checkpoints/{job}/{tile}/{attempt}-{check_index(samples, 'samples')}.npy"


def tile_result_key(job_id: str, tile_index: int, sha256: str) -> str:
    """Key of a finished tile's float accumulator, addressed by its content hash."""
    job = check_token(job_id, "job_id")
    tile = check_index(tile_index, "tile_index")
    return f"tiles/{job}/{tile}/{check_sha256(sha256)}.npy"


def render_sha256(key: str) -> str | None:
    """The content hash a :func:`render_key` carries (None for a key not built by it)."""
    name = key.rpartition("/")[2]
    digest = name.partition(".")[0]
    if not key.startswith("renders/") or SHA256_RE.fullmatch(digest) is None:
        return None
    return digest


def render_key(job_id: str, sha256: str, ext: str) -> str:
    """Key of a final image (``png``) or float image (``npy``), addressed by content hash."""
    kind = ext.removeprefix(".") if isinstance(ext, str) else ext
    if kind not in RENDER_EXTENSIONS:
        raise ValidationError(f"render extension {ext!r} is not one of {sorted(RENDER_EXTENSIONS)}")
    return f"renders/{check_token(job_id, 'job_id')}/{check_sha256(sha256)}.{kind}"


def asset_chunk_key(sha256: str) -> str:
    """Key of one chunk of an asset file (at most 4 MiB), addressed by its content hash."""
    return f"assets/chunks/{check_sha256(sha256, 'chunk sha256')}"


def asset_manifest_key(sha256: str) -> str:
    """Key of an asset's manifest (canonical JSON, :mod:`proto.assets`), by its content hash."""
    return f"assets/manifests/{check_sha256(sha256, 'manifest sha256')}"
