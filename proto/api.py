"""Client API request schemas (JSON over NATS request-reply).

Requests are JSON objects; a request with header ``Content-Type: application/msgpack`` may send
the same object as msgpack. Replies are always JSON: the envelope and error codes are
:mod:`proto.replies`, every verb's ok reply :mod:`proto.api_replies` (and ``docs/api.md``, both
generated from the ``Annotated`` fields). Unknown fields are rejected; ``null`` means "not
given" (the default applies). The limits are documented in :mod:`proto.limits`: a wrong shape or
type is ``bad_request`` (:class:`DecodeError`), a value outside a limit is ``invalid``
(:class:`ValidationError`).

========================  ==================  ==============================================
subject                   schema              fields (defaults)
========================  ==================  ==============================================
``tessera.api.submit``    SubmitRequest       project, scene, width, height, spp, frame (0),
                                              tile_size (64, or auto), max_depth (64),
                                              seed (0),
                                              idempotency_key (derived), renderer (tessera),
                                              priority (50), deadline (none)
``.status/.cancel/.retry``  JobRequest        job_id
``.pause/.resume``        JobRequest          job_id
``tessera.api.priority``  PriorityRequest     job_id, priority
``.project.set``          ProjectSetRequest   name, weight, max_in_flight (none), actor
``.project.list``         ProjectListRequest  limit (1000)
``.project.show``         ProjectShowRequest  name
``tessera.api.list``      ListRequest         state, limit (100), cursor
``.dlq.list``             DlqListRequest      job_id, limit (100), cursor
``.dlq.show``             DlqShowRequest      seq (DLQ stream sequence)
``.dlq.requeue``          DlqRequeueRequest   job_id, dry_run (false), rate (10/s), limit,
                                              seqs (all)
``.dlq.purge``            DlqPurgeRequest     job_id, all (false; or job_id), dry_run (false)
``tessera.api.result``    ResultRequest       job_id, kind (png), inline (false), offset (0),
                                              length (the gateway's chunk)
``.asset.missing``        AssetMissingRequest chunks
``.asset.chunk``          AssetChunkRequest   sha256, data (msgpack only)
``.asset.manifest``       AssetManifestRequest manifest, renderer
``.job.tiles``            JobTilesRequest     job_id, offset (0)
``.job.timeline``         JobTimelineRequest  job_id, limit (200), before_id (none)
``.job.preview``          JobPreviewRequest   job_id, max_edge (512)
``tessera.api.workers``   WorkersRequest      renderer (all)
``tessera.api.farm``      FarmRequest         window (300 s)
========================  ==================  ==============================================
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self, TypeVar

import msgpack
import orjson

from proto.fields import Body, as_int, check_range, check_str
from proto.limits import (
    ASSET_CHUNK_BYTES,
    CURSOR_RE,
    DEFAULT_BOUNCES,
    DEFAULT_FARM_WINDOW,
    DEFAULT_LIST_LIMIT,
    DEFAULT_PREVIEW_EDGE,
    DEFAULT_PRIORITY,
    DEFAULT_REQUEUE_RATE,
    DEFAULT_TILE_SIZE,
    DEFAULT_TIMELINE_LIMIT,
    IDEMPOTENCY_KEY_RE,
    MAX_BOUNCES,
    MAX_DIMENSION,
    MAX_FARM_WINDOW,
    MAX_FRAME,
    MAX_LIST_LIMIT,
    MAX_MISSING_QUERY,
    MAX_PREVIEW_EDGE,
    MAX_PRIORITY,
    MAX_REQUEST_BYTES,
    MAX_REQUEUE_LIMIT,
    MAX_REQUEUE_RATE,
    MAX_REQUEUE_SEQS,
    MAX_RESULT_LENGTH,
    MAX_SEED,
    MAX_SEQ,
    MAX_SPP,
    MAX_TILE_SIZE,
    MAX_TILES,
    MAX_TIMELINE_LIMIT,
    MIN_FARM_WINDOW,
    MIN_PREVIEW_EDGE,
    MIN_TILE_SIZE,
    PROJECT_RE,
    TILE_AUTO,
    Scene,
    TileSize,
    check_scene,
    tile_count,
)
from proto.names import RENDERER_TESSERA, RENDERERS, TOKEN_RE, ApiVerb
from proto.povray import check_povray_options
from shared.core.errors import DecodeError, ValidationError
from shared.core.lifecycle import JobState

MSGPACK = "application/msgpack"


def _job_id(body: Body, name: str = "job_id") -> str:
    return check_str(name, body.string(name), TOKEN_RE, 64)


def _opt_job_id(body: Body) -> str | None:
    value = body.string("job_id", None)
    return None if value is None else check_str("job_id", value, TOKEN_RE, 64)


def _limit(body: Body, hi: int = MAX_LIST_LIMIT) -> int:
    return check_range("limit", body.integer("limit", min(DEFAULT_LIST_LIMIT, hi)), 1, hi)


def parse_deadline(raw: str, *, now: datetime | None = None) -> datetime:
    """An ISO 8601 time with a UTC offset, in the future: as an aware UTC datetime.

    ValidationError for an unparsable time, one without an offset (ambiguous) or one that has
    passed (``now``, default the current time).
    """
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise ValidationError(
            f"deadline: {raw!r:.60} is not an ISO 8601 time (e.g. 2026-12-01T19:00:00Z)"
        ) from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValidationError(f"deadline: {raw!r:.60} has no UTC offset (add Z or +HH:MM)")
    at = at.astimezone(UTC)
    if at <= (now or datetime.now(UTC)):
        raise ValidationError(f"deadline: {at.isoformat()} is in the past")
    return at


def _priority(value: int) -> int:
    return check_range("priority", value, 0, MAX_PRIORITY)


def _cursor(body: Body) -> str | None:
    value = body.string("cursor", None)
    return None if value is None else check_str("cursor", value, CURSOR_RE, 256)


@dataclass(frozen=True)
class SubmitRequest:
    """``tessera.api.submit``: render one frame of a scene. Validated on construction."""

    project: Annotated[str, "project name (groups jobs; 1..64 of [A-Za-z0-9._-])"]
    scene: Annotated[Scene, "a builtin scene name, or an inline scene document (an object)"]
    width: Annotated[int, "image width, pixels (1..8192)"]
    height: Annotated[int, "image height, pixels (1..8192)"]
    spp: Annotated[int, "samples per pixel (1..65536)"]
    frame: Annotated[int, "frame number (0..1,000,000)"] = 0
    tile_size: Annotated[
        TileSize,
        'tile edge, pixels (8..1024; at most 16,384 tiles), or "auto": the scheduler picks it '
        "so that a tile takes about TESSERA_TILE_SECONDS on one core (status shows the edge)",
    ] = DEFAULT_TILE_SIZE
    max_depth: Annotated[int, "bounces per path (1..64)"] = DEFAULT_BOUNCES
    seed: Annotated[int, "noise seed (0..2^32-1)"] = 0
    idempotency_key: Annotated[
        str | None, "the same key returns the same job (default: derived from the body)"
    ] = None
    renderer: Annotated[
        str,
        "tessera (the scene is a builtin or an inline document), blender or povray (the scene "
        'is a reference {"asset": <manifest sha256>, "main": <relative path>} to an uploaded '
        "asset)",
    ] = RENDERER_TESSERA
    priority: Annotated[
        int, "0..100, higher is released first (not part of the idempotency key)"
    ] = DEFAULT_PRIORITY
    deadline: Annotated[
        str | None,
        "ISO 8601 time with a UTC offset, in the future: the job fails ``deadline_exceeded`` "
        "if not completed by then (default none; not part of the idempotency key)",
    ] = None

    def __post_init__(self) -> None:
        check_str("project", self.project, PROJECT_RE, 64)
        if self.renderer not in RENDERERS:
            raise ValidationError(
                f"renderer: {self.renderer!r:.40} is not one of {', '.join(RENDERERS)}"
            )
        if self.renderer == RENDERER_TESSERA:
            check_scene(self.scene)
        else:
            check_reference(self.renderer, self.scene)
        for name, hi in (("width", MAX_DIMENSION), ("height", MAX_DIMENSION), ("spp", MAX_SPP)):
            check_range(name, getattr(self, name), 1, hi)
        check_range("frame", self.frame, 0, MAX_FRAME)
        if self.tile_size != TILE_AUTO:
            edge = check_range("tile_size", self.tile_size, MIN_TILE_SIZE, MAX_TILE_SIZE)
            check_range("tiles", tile_count(self.width, self.height, edge), 1, MAX_TILES)
        check_range("max_depth", self.max_depth, 1, MAX_BOUNCES)
        check_range("seed", self.seed, 0, MAX_SEED)
        if self.idempotency_key is not None:
            check_str("idempotency_key", self.idempotency_key, IDEMPOTENCY_KEY_RE, 128)
        _priority(self.priority)
        if self.deadline is not None:
            parse_deadline(self.deadline)

    def deadline_at(self) -> datetime | None:
        """``deadline`` as an aware UTC datetime (None: no deadline)."""
        return None if self.deadline is None else parse_deadline(self.deadline)

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        ints = {n: body.integer(n) for n in ("width", "height", "spp")}
        defaults = {"frame": 0, "max_depth": DEFAULT_BOUNCES, "seed": 0}
        ints |= {n: body.integer(n, d) for n, d in defaults.items()}
        tile = body.integer_or("tile_size", TILE_AUTO, DEFAULT_TILE_SIZE)
        project, scene = body.string("project"), body.raw("scene")
        key = body.string("idempotency_key", None)
        renderer = body.string("renderer", RENDERER_TESSERA)
        ints["priority"] = body.integer("priority", DEFAULT_PRIORITY)
        deadline = body.string("deadline", None)
        body.done()
        return cls(project=project, scene=scene, idempotency_key=key, renderer=renderer,
                   deadline=deadline, tile_size=TILE_AUTO if tile == TILE_AUTO else int(tile),
                   **ints)  # fmt: skip

    def to_body(self) -> dict[str, Any]:
        """The JSON object a client sends (``renderer`` only if not ``tessera``, so a derived
        idempotency key of a tessera job is what it was before renderers)."""
        body = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if body["renderer"] == RENDERER_TESSERA:
            del body["renderer"]
        return {k: v for k, v in body.items() if v is not None}


SHA256_RE = re.compile(r"[0-9a-f]{64}")
"""A lowercase hex sha256 (an asset manifest's name)."""

REFERENCE_OPTIONS: dict[str, dict[str, type]] = {
    "blender": {"seed": int, "samples_per_pass": int},
    "povray": {"options": list},
}
"""Options a scene reference may carry beside ``asset`` and ``main``, per renderer.

Blender renders with adaptive sampling and denoising off whatever the ``.blend`` says (both
would make a tile differ from the full frame); ``seed`` replaces the ``.blend``'s
``cycles.seed`` (default: the file's), ``samples_per_pass`` the worker's pass size (default 32;
a tile's passes are fixed by it at plan time, and only one pass per tile, ``samples_per_pass``
>= spp, equals Blender's own unsplit render value for value). POV-Ray takes ``options``, a list
of command-line options checked by :func:`proto.povray.check_povray_options` (anti-aliasing
``+A0.1 +R3``, quality, clock, declared constants: only what tiles exactly)."""

MAX_BLENDER_SEED = 2**31 - 1
"""``cycles.seed`` is a signed 32-bit int."""


def check_reference(renderer: str, scene: Any) -> dict[str, Any]:
    """A scene reference ``{"asset": <sha256>, "main": <relative path>, ...options}``.

    ``main`` is a relative POSIX path inside the asset (no ``..``, no leading ``/``, no
    backslash). An option that would make tiles differ from the renderer's own full frame is
    refused here, at submit: POV-Ray's jitter (``+J``), region or size options.
    """
    if not isinstance(scene, dict):
        raise DecodeError(
            f'scene: a {renderer} job takes a reference {{"asset": ..., "main": ...}}, '
            f"got {type(scene).__name__}"
        )
    asset, main = scene.get("asset"), scene.get("main")
    if not isinstance(asset, str) or SHA256_RE.fullmatch(asset) is None:
        raise ValidationError("scene.asset: expected the manifest's sha256 (64 lowercase hex)")
    if not isinstance(main, str) or not 0 < len(main) <= 1024:
        raise ValidationError("scene.main: expected the main file's relative path (1..1024)")
    parts = main.split("/")
    if main.startswith("/") or "\\" in main or any(p in ("", ".", "..") for p in parts):
        raise ValidationError(f"scene.main: {main!r:.80} is not a plain relative path")
    _check_options(renderer, scene)
    return scene


def _check_options(renderer: str, scene: dict[str, Any]) -> None:
    allowed = REFERENCE_OPTIONS[renderer]
    for key, value in scene.items():
        if key in ("asset", "main"):
            continue
        kind = allowed.get(key)
        if kind is None:
            known = ", ".join(["asset", "main", *allowed])
            raise ValidationError(f"scene.{key:.40}: not an option of {renderer} ({known})")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValidationError(f"scene.{key}: expected a {kind.__name__}")
    if "seed" in scene:
        check_range("scene.seed", scene["seed"], 0, MAX_BLENDER_SEED)
    if "samples_per_pass" in scene:
        check_range("scene.samples_per_pass", scene["samples_per_pass"], 1, MAX_SPP)
    if "options" in scene:
        try:
            check_povray_options(scene["options"])
        except ValidationError as exc:
            raise ValidationError(f"scene.options: {exc}") from None


@dataclass(frozen=True)
class JobRequest:
    """``status``, ``cancel`` and ``retry``: one ``job_id``."""

    job_id: Annotated[str, "the job's id"]

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id = _job_id(body)
        body.done()
        return cls(job_id)


StatusRequest = CancelRequest = RetryRequest = PauseRequest = ResumeRequest = JobRequest


@dataclass(frozen=True)
class PriorityRequest:
    """``tessera.api.priority``: change a queued, running, progressing or paused job's priority."""

    job_id: Annotated[str, "the job's id"]
    priority: Annotated[int, "the new priority, 0..100 (higher is released first)"]

    def __post_init__(self) -> None:
        _priority(self.priority)

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id, priority = _job_id(body), body.integer("priority")
        body.done()
        return cls(job_id, priority)


MAX_WEIGHT = 1e6
ACTOR_RE = PROJECT_RE


def _weight(body: Body) -> float:
    value = body.raw("weight")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecodeError(f"weight: expected a number, got {type(value).__name__}")
    weight = float(value)
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise ValidationError(f"weight: {value!r:.40} must be a finite number > 0 and <= 1e6")
    return weight


@dataclass(frozen=True)
class ProjectSetRequest:
    """``tessera.api.project.set``: a project's fair-share weight and in-flight cap (upsert).

    Audited in ``project_events`` with ``actor``: the client's ``--actor`` if given, else the
    NATS user the request came from (the gateway's user when the server does not say).
    """

    name: Annotated[str, "project name (1..64 of [A-Za-z0-9._-])"]
    weight: Annotated[float, "fair-share weight, a finite number > 0 (at most 1e6)"]
    max_in_flight: Annotated[
        int | None, "at most this many of its tiles leased at once (>= 1; null: no cap)"
    ] = None
    actor: Annotated[str | None, "who makes the change, for the audit (default: the sender)"] = None

    def __post_init__(self) -> None:
        check_str("name", self.name, PROJECT_RE, 64)
        if not (math.isfinite(self.weight) and 0 < self.weight <= MAX_WEIGHT):
            raise ValidationError(f"weight: {self.weight!r} must be a finite number > 0")
        if self.max_in_flight is not None:
            check_range("max_in_flight", self.max_in_flight, 1, MAX_TILES * 1000)
        if self.actor is not None:
            check_str("actor", self.actor, ACTOR_RE, 128)

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        name, weight = body.string("name"), _weight(body)
        cap = body.integer("max_in_flight", None)
        actor = body.string("actor", None)
        body.done()
        return cls(name, weight, cap, actor)


@dataclass(frozen=True)
class ProjectListRequest:
    """``tessera.api.project.list``: projects by name (configured, or named by a live job or
    by recent work)."""

    limit: Annotated[int, "at most this many projects (1..1000)"] = MAX_LIST_LIMIT

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        limit = check_range("limit", body.integer("limit", MAX_LIST_LIMIT), 1, MAX_LIST_LIMIT)
        body.done()
        return cls(limit)


@dataclass(frozen=True)
class ProjectShowRequest:
    """``tessera.api.project.show``: one project."""

    name: Annotated[str, "project name"]

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        name = check_str("name", body.string("name"), PROJECT_RE, 64)
        body.done()
        return cls(name)


@dataclass(frozen=True)
class ListRequest:
    """``tessera.api.list``: jobs, newest first, optionally in one state, a page at a time."""

    state: Annotated[JobState | None, "only jobs in this job state (default: all)"] = None
    limit: Annotated[int, "page size (1..1000)"] = DEFAULT_LIST_LIMIT
    cursor: Annotated[str | None, "``next_cursor`` of the previous page"] = None

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        raw = body.string("state", None)
        if raw is not None and raw not in {s.value for s in JobState}:
            states = ", ".join(s.value for s in JobState)
            raise ValidationError(f"state: {raw!r:.40} is not one of {states}")
        state = None if raw is None else JobState(raw)
        limit, cursor = _limit(body), _cursor(body)
        body.done()
        return cls(state, limit, cursor)


@dataclass(frozen=True)
class DlqListRequest:
    """``tessera.api.dlq.list``: dead letters, optionally of one job, a page at a time."""

    job_id: Annotated[str | None, "only this job's dead letters (default: all)"] = None
    limit: Annotated[int, "page size (1..1000)"] = DEFAULT_LIST_LIMIT
    cursor: Annotated[str | None, "``next_cursor`` of the previous page"] = None

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id, limit, cursor = _opt_job_id(body), _limit(body), _cursor(body)
        body.done()
        return cls(job_id, limit, cursor)


@dataclass(frozen=True)
class DlqShowRequest:
    """``tessera.api.dlq.show``: one dead letter by its DLQ stream sequence."""

    seq: Annotated[int, "the letter's sequence in the DLQ stream (``seq`` in dlq.list)"]

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        seq = check_range("seq", body.integer("seq"), 1, MAX_SEQ)
        body.done()
        return cls(seq)


@dataclass(frozen=True)
class DlqRequeueRequest:
    """``tessera.api.dlq.requeue``: republish dead letters (all, or one job's) at a bounded rate.

    ``dry_run`` reports what would be requeued without touching anything.
    """

    job_id: Annotated[str | None, "only this job's dead letters (default: all)"] = None
    dry_run: Annotated[bool, "only report what would be done"] = False
    rate: Annotated[int, "requeues per second (1..1000)"] = DEFAULT_REQUEUE_RATE
    limit: Annotated[int, "at most this many letters (1..10,000)"] = MAX_REQUEUE_LIMIT
    seqs: Annotated[
        list[int] | None,
        "only these dead letters (DLQ stream sequences, 1..1000 of them; with job_id, only "
        "those of that job); default: every one matching job_id",
    ] = None

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id, dry_run = _opt_job_id(body), body.boolean("dry_run", False)
        rate = check_range("rate", body.integer("rate", DEFAULT_REQUEUE_RATE), 1, MAX_REQUEUE_RATE)
        limit = check_range("limit", body.integer("limit", MAX_REQUEUE_LIMIT), 1, MAX_REQUEUE_LIMIT)
        raw = body.raw("seqs") if body.has("seqs") else None
        body.done()
        seqs = None if raw is None else _seqs(raw)
        return cls(job_id, dry_run, rate, limit, seqs)


def _seqs(raw: Any) -> list[int]:
    if not isinstance(raw, list):
        raise DecodeError(f"seqs: expected an array, got {type(raw).__name__}")
    check_range("seqs", len(raw), 1, MAX_REQUEUE_SEQS)
    seqs = [
        check_range(f"seqs[{i}]", as_int(f"seqs[{i}]", s), 1, MAX_SEQ) for i, s in enumerate(raw)
    ]
    return list(dict.fromkeys(seqs))


@dataclass(frozen=True)
class DlqPurgeRequest:
    """``tessera.api.dlq.purge``: delete one job's dead letters, or all with ``all: true``."""

    job_id: Annotated[str | None, "delete this job's dead letters"] = None
    all: Annotated[bool, "delete every dead letter (instead of job_id)"] = False
    dry_run: Annotated[bool, "only count"] = False

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id, everything = _opt_job_id(body), body.boolean("all", False)
        dry_run = body.boolean("dry_run", False)
        body.done()
        if (job_id is None) == (not everything):
            raise ValidationError("job_id: give exactly one of job_id or all=true")
        return cls(job_id, everything, dry_run)


ResultKind = Literal["png", "float"]
RESULT_KINDS: tuple[ResultKind, ...] = ("png", "float")


@dataclass(frozen=True)
class ResultRequest:
    """``tessera.api.result``: download a completed job's image without store credentials.

    The reply (:class:`proto.api_replies.ResultReply`) is a presigned URL where the store can
    sign one (S3) and ``inline`` is false, else ``length`` bytes from ``offset`` in the reply.
    """

    job_id: Annotated[str, "the job's id"]
    kind: Annotated[ResultKind, "``png`` (the image) or ``float`` (the float image, .npy)"] = "png"
    inline: Annotated[bool, "bytes over NATS even where the store could sign a URL"] = False
    offset: Annotated[int, "first byte of the chunk (0..size)"] = 0
    length: Annotated[
        int | None, "at most this many bytes (1..2^31-1; default and cap: the gateway's chunk)"
    ] = None

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id, kind = _job_id(body), body.string("kind", "png")
        if kind not in RESULT_KINDS:
            raise ValidationError(f"kind: {kind!r:.40} is not one of {', '.join(RESULT_KINDS)}")
        inline = body.boolean("inline", False)
        offset = check_range("offset", body.integer("offset", 0), 0, MAX_SEQ)
        length = body.integer("length", None)
        if length is not None:
            check_range("length", length, 1, MAX_RESULT_LENGTH)
        body.done()
        return cls(job_id, "float" if kind == "float" else "png", inline, offset, length)


_SHA256 = re.compile(r"[0-9a-f]{64}")
RENDERER_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")


@dataclass(frozen=True)
class AssetMissingRequest:
    """``tessera.api.asset.missing``: which of these chunks the object store does not hold.

    A client asks before uploading and sends only those (a second upload of the same files sends
    none). An empty ``chunks`` asks only for the gateway's asset limits.
    """

    chunks: Annotated[list[str], "chunk sha256 digests, at most 128 (duplicates ignored)"]

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        raw = body.raw("chunks")
        body.done()
        if not isinstance(raw, list):
            raise DecodeError(f"chunks: expected an array, got {type(raw).__name__}")
        check_range("chunks", len(raw), 0, MAX_MISSING_QUERY)
        return cls([_sha256(f"chunks[{i}]", c) for i, c in enumerate(raw)])


@dataclass(frozen=True)
class AssetChunkRequest:
    """``tessera.api.asset.chunk``: store one chunk of an asset file under its sha256.

    msgpack only (header ``Content-Type: application/msgpack``): ``data`` is binary, which
    JSON cannot carry. The gateway checks the sha256 before storing anything; a chunk already
    stored is not written again.
    """

    sha256: Annotated[str, "sha256 (hex) of ``data``"]
    data: Annotated[bytes, "the chunk's bytes: 1..4 MiB (msgpack bin)"]

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        digest = _sha256("sha256", body.string("sha256"))
        data = body.raw("data")
        body.done()
        if not isinstance(data, bytes):
            kind = type(data).__name__
            raise DecodeError(f"data: expected binary (msgpack bin; not JSON), got {kind}")
        check_range("data", len(data), 1, ASSET_CHUNK_BYTES)
        return cls(digest, data)


@dataclass(frozen=True)
class AssetManifestRequest:
    """``tessera.api.asset.manifest``: store an asset's manifest once every chunk is stored.

    The gateway checks the manifest (paths, sizes: :mod:`proto.assets`), that every chunk is
    stored with the size its place implies, and for ``renderer`` ``povray`` that every file the
    scene names (``#include``, image maps ...) is in the asset or is a POV-Ray library file.
    """

    manifest: Annotated[dict[str, Any], "``{main, files: [{path, size, sha256, chunks}]}``"]
    renderer: Annotated[str | None, "the renderer the asset is for (``povray`` is scanned)"] = None

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body (the manifest's rules are checked by the gateway)."""
        manifest, renderer = body.raw("manifest"), body.string("renderer", None)
        body.done()
        if not isinstance(manifest, dict):
            raise DecodeError(f"manifest: expected an object, got {type(manifest).__name__}")
        if renderer is not None:
            check_str("renderer", renderer, RENDERER_RE, 32)
        return cls(manifest, renderer)


@dataclass(frozen=True)
class JobTilesRequest:
    """``tessera.api.job.tiles``: every tile of a job with its audit counts, in index order.

    One reply holds a 4,096-tile job; a larger job (or long error texts) continues with
    ``offset: next_offset``.
    """

    job_id: Annotated[str, "the job's id"]
    offset: Annotated[int, "first tile index of the page (0..16,383)"] = 0

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id = _job_id(body)
        offset = check_range("offset", body.integer("offset", 0), 0, MAX_TILES - 1)
        body.done()
        return cls(job_id, offset)


@dataclass(frozen=True)
class JobTimelineRequest:
    """``tessera.api.job.timeline``: a job's audit trail, newest first, a page at a time."""

    job_id: Annotated[str, "the job's id"]
    limit: Annotated[int, "page size (1..1000)"] = DEFAULT_TIMELINE_LIMIT
    before_id: Annotated[
        int | None, "only rows older than this ``id`` (the previous page's ``next_before_id``)"
    ] = None

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id = _job_id(body)
        limit = body.integer("limit", DEFAULT_TIMELINE_LIMIT)
        check_range("limit", limit, 1, MAX_TIMELINE_LIMIT)
        before = body.integer("before_id", None)
        if before is not None:
            check_range("before_id", before, 1, MAX_SEQ)
        body.done()
        return cls(job_id, limit, before)


@dataclass(frozen=True)
class JobPreviewRequest:
    """``tessera.api.job.preview``: the image so far, from committed tiles and the latest
    checkpoints, tone-mapped and downscaled to fit ``max_edge``."""

    job_id: Annotated[str, "the job's id"]
    max_edge: Annotated[int, "the preview's longer side, at most this many pixels (16..2048)"] = (
        DEFAULT_PREVIEW_EDGE
    )

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        job_id = _job_id(body)
        edge = body.integer("max_edge", DEFAULT_PREVIEW_EDGE)
        check_range("max_edge", edge, MIN_PREVIEW_EDGE, MAX_PREVIEW_EDGE)
        body.done()
        return cls(job_id, edge)


@dataclass(frozen=True)
class WorkersRequest:
    """``tessera.api.workers``: the live workers (the ``tessera-workers`` bucket), by node."""

    renderer: Annotated[str | None, "only workers that run this renderer (default: all)"] = None

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        renderer = body.string("renderer", None)
        body.done()
        if renderer is not None:
            check_str("renderer", renderer, RENDERER_RE, 32)
        return cls(renderer)


@dataclass(frozen=True)
class FarmRequest:
    """``tessera.api.farm``: the farm's operational numbers over the last ``window`` seconds."""

    window: Annotated[int, "seconds of audit trail the rates and latencies cover (10..86,400)"] = (
        DEFAULT_FARM_WINDOW
    )

    @classmethod
    def from_body(cls, body: Body) -> Self:
        """Read and validate a parsed body."""
        window = body.integer("window", DEFAULT_FARM_WINDOW)
        check_range("window", window, MIN_FARM_WINDOW, MAX_FARM_WINDOW)
        body.done()
        return cls(window)


def _sha256(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise DecodeError(f"{name}: expected a string, got {type(value).__name__}")
    return check_str(name, value, _SHA256, 64)


R = TypeVar("R", SubmitRequest, JobRequest, ListRequest, DlqListRequest, DlqShowRequest,
            DlqRequeueRequest, DlqPurgeRequest, ResultRequest, PriorityRequest,
            ProjectSetRequest, ProjectListRequest, ProjectShowRequest, AssetMissingRequest,
            AssetChunkRequest, AssetManifestRequest, JobTilesRequest, JobTimelineRequest,
            JobPreviewRequest, WorkersRequest, FarmRequest)  # fmt: skip
REQUEST_SCHEMAS = (SubmitRequest, JobRequest, ListRequest, DlqListRequest, DlqShowRequest,
                   DlqRequeueRequest, DlqPurgeRequest, ResultRequest, PriorityRequest,
                   ProjectSetRequest, ProjectListRequest, ProjectShowRequest,
                   AssetMissingRequest, AssetChunkRequest, AssetManifestRequest,
                   JobTilesRequest, JobTimelineRequest, JobPreviewRequest, WorkersRequest,
                   FarmRequest)  # fmt: skip


VERB_REQUESTS: dict[ApiVerb, type] = {
    ApiVerb.SUBMIT: SubmitRequest,
    ApiVerb.STATUS: StatusRequest,
    ApiVerb.LIST: ListRequest,
    ApiVerb.CANCEL: CancelRequest,
    ApiVerb.RETRY: RetryRequest,
    ApiVerb.RESULT: ResultRequest,
    ApiVerb.DLQ_LIST: DlqListRequest,
    ApiVerb.DLQ_SHOW: DlqShowRequest,
    ApiVerb.DLQ_REQUEUE: DlqRequeueRequest,
    ApiVerb.DLQ_PURGE: DlqPurgeRequest,
    ApiVerb.PRIORITY: PriorityRequest,
    ApiVerb.PAUSE: PauseRequest,
    ApiVerb.RESUME: ResumeRequest,
    ApiVerb.PROJECT_SET: ProjectSetRequest,
    ApiVerb.PROJECT_LIST: ProjectListRequest,
    ApiVerb.PROJECT_SHOW: ProjectShowRequest,
    ApiVerb.ASSET_MISSING: AssetMissingRequest,
    ApiVerb.ASSET_CHUNK: AssetChunkRequest,
    ApiVerb.ASSET_MANIFEST: AssetManifestRequest,
    ApiVerb.JOB_TILES: JobTilesRequest,
    ApiVerb.JOB_TIMELINE: JobTimelineRequest,
    ApiVerb.JOB_PREVIEW: JobPreviewRequest,
    ApiVerb.WORKERS: WorkersRequest,
    ApiVerb.FARM: FarmRequest,
}
"""The request schema of every verb."""


def decode_request(data: bytes, headers: Mapping[str, str] | None, schema: type[R]) -> R:
    """Parse a request body (JSON, or msgpack per ``Content-Type``) into ``schema``.

    Raises :class:`DecodeError` for malformed input and :class:`ValidationError` for values
    outside the documented limits; nothing else.
    """
    if len(data) > MAX_REQUEST_BYTES:
        raise ValidationError(f"request: {len(data)} bytes exceeds the limit {MAX_REQUEST_BYTES}")
    content_type = _content_type(headers)
    try:
        if content_type == MSGPACK:
            parsed = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
        else:
            parsed = orjson.loads(data)
    except Exception as exc:  # either parser raises several types for garbage
        what = "msgpack" if content_type == MSGPACK else "JSON"
        raise DecodeError(f"request: body is not valid {what} ({type(exc).__name__})") from exc
    try:
        return schema.from_body(Body(schema.__name__, parsed))
    except RecursionError as exc:  # defence in depth: depth is bounded before recursion
        raise DecodeError("request: nesting too deep") from exc


def _content_type(headers: Mapping[str, str] | None) -> str:
    for key, value in (headers or {}).items():
        if key.lower() == "content-type":
            kind = str(value).split(";", 1)[0].strip().lower()
            if kind not in ("application/json", MSGPACK):
                raise DecodeError(f"Content-Type: {kind!r:.40} is not application/json or msgpack")
            return kind
    return "application/json"


def encode_request(request: SubmitRequest | Any) -> bytes:
    """JSON body of a request object (for clients and tests)."""
    body = request.to_body() if isinstance(request, SubmitRequest) else vars(request)
    return orjson.dumps({k: v for k, v in body.items() if v is not None})
