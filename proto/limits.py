"""Documented limits of the client API, and the checks that need more than one field.

Limits (``bad_request`` for a wrong shape or type, ``invalid`` for a value outside a limit):

- request body: at most 5 MiB (:data:`MAX_REQUEST_BYTES`). Every NATS server configuration
  Tessera ships (``tessera up`` and the test stack via :mod:`shared.devstack.stack`,
  ``deploy/nats/tessera-auth.conf`` for compose, ``k8s/nats-values.yaml``) sets ``max_payload``
  to :data:`NATS_MAX_PAYLOAD` (8 MiB: the largest body plus room for headers), so every body
  within the limits reaches the gateway, and one above 5 MiB is answered ``invalid``. The
  ``tessera`` client refuses a body above either limit before sending it (exit status 2)
- ``project``: 1..64 characters ``[A-Za-z0-9._-]``, starting alphanumeric
- ``scene``: a builtin name (1..64 characters ``[a-z0-9_-]``) or an inline scene document (a JSON
  object, canonical JSON at most 4 MiB, nesting at most 32 deep; its contents are the kernel's
  to validate)
- ``frame``: 0..1,000,000 (default 0); a client expanding a frame range sends one request per
  frame, at most 1,000 frames (:func:`frame_range`)
- ``width``, ``height``: 1..8192 pixels; ``spp`` (samples per pixel): 1..65536
- ``tile_size``: 8..1024 (default 64), and at most 16,384 tiles per job; or ``"auto"``: the
  scheduler picks the edge when it plans the job (:func:`shared.core.tiles.auto_tile_edge`)
- ``max_depth`` (bounces): 1..64 (default 64, as the kernel: Russian roulette ends most paths
  far sooner); ``seed``: 0..2^32-1 (default 0)
- ``idempotency_key``: 1..128 characters ``[A-Za-z0-9._:-]``
- ``job_id``: 1..64 characters ``[A-Za-z0-9_-]`` (Tessera issues UUIDv7 strings)
- list/DLQ ``limit``: 1..1000 (default 100); ``cursor``: 1..256 printable ASCII characters
- DLQ requeue ``rate``: 1..1000 messages per second (default 10), ``limit`` up to 10,000
- replies: a page or a requeue report is cut to about 512 KiB of JSON (:data:`MAX_REPLY_BYTES`,
  half of NATS's default 1 MiB ``max_payload``, so replies fit a server left at the default); a
  list page cut short says so through ``next_cursor``, a requeue report through ``omitted``. A
  dead letter's ``error`` is cut to 500 characters in lists (:data:`MAX_VIEW_ERROR`); ``dlq
  show`` has it whole
- ``result`` ``offset``: 0..the object's size; ``length``: 1..2^31-1, capped at the gateway's
  chunk (about 3/4 of its reply budget, so the base64 fits)
- assets (:mod:`proto.assets`): ``asset.chunk`` carries one chunk of at most 4 MiB
  (:data:`ASSET_CHUNK_BYTES`, msgpack); ``asset.missing`` at most 128 digests
  (:data:`MAX_MISSING_QUERY`); a manifest at most 10,000 files (:data:`MAX_ASSET_FILES`) and
  2 MiB of canonical JSON (:data:`MAX_MANIFEST_BYTES`), its files at most the gateway's
  ``TESSERA_ASSET_MAX_BYTES`` in all
- console verbs: ``job.timeline`` ``limit`` 1..1000 (default 200), ``before_id`` 1..2^63-1;
  ``job.tiles`` ``offset`` 0..16,383; ``job.preview`` ``max_edge`` 16..2048 pixels (default
  512); ``farm`` ``window`` 10..86,400 seconds (default 300)
- every integer must be a finite whole number (``64.0`` is accepted as 64; booleans, ``1.5``,
  NaN and out-of-range values are not)
"""

from __future__ import annotations

import math
import re
from typing import Any, Final, Literal

from proto.canonical import canonical_json
from proto.fields import check_range, check_str, json_depth
from shared.core.errors import DecodeError, ValidationError

MAX_REQUEST_BYTES = 5 * 1024 * 1024
NATS_MAX_PAYLOAD = 8 * 1024 * 1024
"""``max_payload`` of every NATS server Tessera configures: the one source of that number."""
NATS_MAX_PENDING = 32 * NATS_MAX_PAYLOAD
"""``max_pending`` of every NATS server Tessera configures: bytes the server buffers for one
connection before cutting it as a slow consumer. NATS's default, 64 MiB, holds only 8 bodies of
``max_payload``, and a gateway on a starved core was cut by a 114 MB burst of refused submits
(issue 14); 256 MiB holds 32 of the largest bodies, or that whole burst. It costs memory only
for a connection that actually lags."""
MAX_SCENE_BYTES = 4 * 1024 * 1024
MAX_SCENE_DEPTH = 32
MAX_DIMENSION = 8192
MAX_SPP = 65536
MIN_TILE_SIZE, MAX_TILE_SIZE, DEFAULT_TILE_SIZE = 8, 1024, 64
TILE_AUTO: Final = "auto"
"""``tile_size`` of a job whose edge the scheduler picks when it plans it."""
MAX_TILES = 16384
MAX_FRAME = 1_000_000
MAX_FRAME_RANGE = 1000
MAX_BOUNCES, DEFAULT_BOUNCES = 64, 64
MAX_SEED = 2**32 - 1
MAX_LIST_LIMIT, DEFAULT_LIST_LIMIT = 1000, 100
#: a job's priority: 0..100, higher first
MAX_PRIORITY, DEFAULT_PRIORITY = 100, 50
MAX_REQUEUE_LIMIT, MAX_REQUEUE_RATE, DEFAULT_REQUEUE_RATE = 10_000, 1000, 10
#: dead letters one ``dlq.requeue`` may name by sequence
MAX_REQUEUE_SEQS = 1000
MAX_SEQ = 2**63 - 1
MAX_TIMELINE_LIMIT, DEFAULT_TIMELINE_LIMIT = 1000, 200
MIN_PREVIEW_EDGE, MAX_PREVIEW_EDGE, DEFAULT_PREVIEW_EDGE = 16, 2048, 512
MIN_FARM_WINDOW, MAX_FARM_WINDOW, DEFAULT_FARM_WINDOW = 10, 86_400, 300
MAX_REPLY_BYTES = 512 * 1024
MAX_VIEW_ERROR = 500
MAX_RESULT_LENGTH = 2**31 - 1
ASSET_CHUNK_BYTES = 4 * 1024 * 1024
"""Bytes of every chunk of an asset file but its last (see :mod:`proto.assets`): one
``asset.chunk`` request carries one chunk, within :data:`MAX_REQUEST_BYTES` as msgpack."""
MAX_ASSET_FILES = 10_000
MAX_MANIFEST_BYTES = 2 * 1024 * 1024
MAX_MISSING_QUERY = 128
"""Chunk digests per ``asset.missing`` request: about 9 KB of JSON, a small request."""

PROJECT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
BUILTIN_SCENE_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
IDEMPOTENCY_KEY_RE = re.compile(r"[A-Za-z0-9._:-]+")
CURSOR_RE = re.compile(r"[!-~]+")

Scene = str | dict[str, Any]
"""A builtin scene name or an inline scene document."""

TileSize = int | Literal["auto"]
"""A tile edge in pixels, or :data:`TILE_AUTO`."""


def tile_count(width: int, height: int, tile_size: int) -> int:
    """Number of tiles of a ``width`` x ``height`` image cut into ``tile_size`` squares."""
    return -(-width // tile_size) * -(-height // tile_size)


AUTO_TILE_MIN, AUTO_TILE_MAX, AUTO_TILE_STEP = 16, 512, 8
"""The edges ``tile_size: "auto"`` picks from: multiples of the step within the bounds."""


def auto_tile_edge(
    width: int,
    height: int,
    spp: int,
    *,
    seconds_per_sample: float,
    target_seconds: float,
    threads: int,
    step: int = AUTO_TILE_STEP,
) -> int:
    """The tile edge of ``tile_size: "auto"``.

    A tile of ``edge``² pixels at ``spp`` samples takes about ``target_seconds`` on one core
    when a pixel-sample costs ``seconds_per_sample``: that edge, rounded to a multiple of
    ``step``, within :data:`AUTO_TILE_MIN`..:data:`AUTO_TILE_MAX` and no larger than the image.
    Then it shrinks (not below the minimum) until the image has at least ``threads`` tiles, so
    every kernel thread of the farm has one, and grows until it has at most :data:`MAX_TILES`.
    Last, the same grid is evened out: the smallest edge (a multiple of ``step``) that still
    covers the image in as many columns and rows, so the last ones are not slivers.
    """
    if min(width, height, spp, threads, step) < 1 or not seconds_per_sample > 0:
        raise ValueError(f"auto tile of {width}x{height} at {spp} spp, {seconds_per_sample} s")
    lo = -(-AUTO_TILE_MIN // step) * step
    ideal = math.sqrt(max(target_seconds, 0.0) / (seconds_per_sample * spp))
    image = -(-max(width, height) // step) * step
    edge = min(max(round(ideal / step) * step, lo), AUTO_TILE_MAX, max(image, lo))
    while edge - step >= lo and tile_count(width, height, edge) < threads:
        edge -= step
    while tile_count(width, height, edge) > MAX_TILES:
        edge += step
    columns, rows = -(-width // edge), -(-height // edge)
    even = max(_round_up(_ceil_div(width, columns), step), _round_up(_ceil_div(height, rows), step))
    return max(even, lo) if tile_count(width, height, max(even, lo)) <= MAX_TILES else edge


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(value: int, step: int) -> int:
    return _ceil_div(value, step) * step


def frame_range(first: int, last: int) -> range:
    """The frames ``first..last`` (inclusive) a client submits one by one, within the limits."""
    check_range("frame", first, 0, MAX_FRAME)
    check_range("frame", last, first, MAX_FRAME)
    check_range("frames", last - first + 1, 1, MAX_FRAME_RANGE)
    return range(first, last + 1)


def check_scene(scene: Any) -> Scene:
    """A builtin scene name or an inline document within the size and depth limits."""
    if isinstance(scene, str):
        return check_str("scene", scene, BUILTIN_SCENE_RE, 64)
    if not isinstance(scene, dict):
        raise DecodeError(f"scene: expected a name or an object, got {type(scene).__name__}")
    depth = json_depth(scene)
    if depth > MAX_SCENE_DEPTH:
        raise ValidationError(f"scene: nesting depth {depth} exceeds the limit {MAX_SCENE_DEPTH}")
    try:
        size = len(canonical_json(scene))
    except ValidationError as exc:
        raise ValidationError(f"scene: {exc}") from exc
    if size > MAX_SCENE_BYTES:
        raise ValidationError(f"scene: {size} bytes exceeds the limit {MAX_SCENE_BYTES}")
    return scene
