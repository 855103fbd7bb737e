"""Client API reply schemas: one frozen dataclass per verb, encoded by :func:`encode_reply`.

An ok reply is the JSON object ``{"ok": true, <the fields of the verb's reply>}`` (errors:
:mod:`proto.replies`). Every field is always present; ``null`` is a value ("none", "not yet"),
never "field left out". Each field is ``Annotated[type, "unit and meaning"]``: the text
``docs/api.md`` is generated from (``make api-docs``, i.e. ``python -m proto.apidoc``); tests
check that page, the table below and the gateway's real replies against these classes, so none
can drift.

Timestamps are ISO 8601 strings with a UTC offset (``2026-12-01T19:13:35.123456+00:00``).
Object keys (``result_location``, ``float_location``) are relative to the object store's root
(the ``file://`` directory or the ``s3://`` bucket); a client without store credentials fetches
the image with ``tessera.api.result`` instead (:class:`ResultReply`).

========================  ==================  ==============================================
subject                   schema              fields
========================  ==================  ==============================================
``tessera.api.submit``    SubmitReply         job_id, created, duplicate, state,
                                              idempotency_key, input_hash
``tessera.api.status``    StatusReply         (JobSummary's), idempotency_key, input_hash,
                                              tile_size, tile_auto, tiles_total, tiles_done,
                                              tiles_by_state, samples_total, samples_done,
                                              cancel_requested, result_location,
                                              result_sha256, float_location, last_error_code,
                                              last_error, waiting
``tessera.api.list``      ListReply           jobs, next_cursor
``tessera.api.cancel``    CancelReply         job_id, state, cancel_requested
``tessera.api.retry``     RetryReply          job_id, state, generation, replayed
``tessera.api.result``    ResultReply         job_id, kind, content_type, size, sha256, url,
                                              expires_at, offset, length, data_b64,
                                              next_offset
``.dlq.list``             DlqListReply        dead_letters, next_cursor
``.dlq.show``             DlqShowReply        dead_letter
``.dlq.requeue``          DlqRequeueReply     dry_run, requeued, skipped, examined,
                                              dead_letters, omitted, missing
``.dlq.purge``            DlqPurgeReply       purged, matched, dry_run
``tessera.api.priority``  PriorityReply       job_id, state, priority
``tessera.api.pause``     PauseReply          job_id, state, tiles_unreleased
``tessera.api.resume``    ResumeReply         job_id, state
``.project.set``          ProjectSetReply     name, weight, max_in_flight, actor
``.project.list``         ProjectListReply    projects, window_seconds
``.project.show``         ProjectShowReply    project, window_seconds
``.asset.missing``        AssetMissingReply   missing, chunk_bytes, max_asset_bytes,
                                              max_query
``.asset.chunk``          AssetChunkReply     sha256, size, stored
``.asset.manifest``       AssetManifestReply  asset, main, files, size, stored
``.job.tiles``            JobTilesReply       job_id, width, height, tile_size, renderer,
                                              state, spp, tiles_total, columns, tiles,
                                              offset, next_offset
``.job.timeline``         JobTimelineReply    job_id, events, next_before_id
``.job.preview``          JobPreviewReply     job_id, width, height, tiles_done, tiles_total,
                                              samples_done, samples_total, content_type,
                                              data_b64, version, max_edge, encoded_at
``tessera.api.workers``   WorkersReply        workers, threads, at
``tessera.api.farm``      FarmReply           queue_depth, oldest_age_s, in_flight,
                                              retry_rate, duplicates_suppressed,
                                              lease_renewal_failures, resume_rate,
                                              latency_p50_s, latency_p95_s, latency_p99_s,
                                              dlq_size, finalization_failures, window_s, at
(items)                   JobSummary          job_id, project, state, frame, width, height,
                                              spp, generation, created_at, updated_at,
                                              finished_at, priority, deadline_at, renderer
(items)                   DeadLetterView      seq, subject, time, malformed, job_id, unit,
                                              reason, error, source_stream, source_seq,
                                              deliveries, original_subject
(items)                   DeadLetterDetail    (DeadLetterView's), payload_b64
(items)                   RequeueView         seq, job_id, unit, reason, error, action, why,
                                              tile, generation, done
(items)                   ProjectView         name, configured, weight, max_in_flight,
                                              queued, in_flight, core_seconds, share
(items)                   TimelineEvent       id, at, kind, entity, tile_index, attempt_id,
                                              node, from_state, to_state, detail,
                                              error_code, error
(items)                   WorkerView          node, threads, in_hand, renderers, version,
                                              started_at, uptime_s, current_tiles
========================  ==================  ==============================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, get_type_hints

from proto.api import ResultKind
from proto.names import ApiVerb
from proto.replies import ok_reply

__all__ = [
    "REPLY_SCHEMAS",
    "TILE_COLUMNS",
    "VERB_REPLIES",
    "encode_reply",
    "field_docs",
    "reply_fields",
]


_JOB_STATE = "job state (see *Job states*)"


@dataclass(frozen=True)
class SubmitReply:
    """``tessera.api.submit``: the job this submission is bound to."""

    job_id: Annotated[str, "the job's id (a UUIDv7 string)"]
    created: Annotated[bool, "true if this request created the job"]
    duplicate: Annotated[bool, "true if an earlier request with the same idempotency key did"]
    state: Annotated[str, f"the {_JOB_STATE} now"]
    idempotency_key: Annotated[str, "the key given, or the one derived from the request body"]
    input_hash: Annotated[str, "sha256 (hex) of everything that determines the image"]


@dataclass(frozen=True)
class JobSummary:
    """One job in ``list`` (and the first fields of ``status``)."""

    job_id: Annotated[str, "the job's id"]
    project: Annotated[str, "project named at submit"]
    state: Annotated[str, _JOB_STATE]
    frame: Annotated[int, "frame number"]
    width: Annotated[int, "image width, pixels"]
    height: Annotated[int, "image height, pixels"]
    spp: Annotated[int, "samples per pixel requested"]
    generation: Annotated[int, "0, plus one per retry of the job"]
    created_at: Annotated[str, "when the job was submitted (timestamp)"]
    updated_at: Annotated[str, "last change of the job's row (timestamp)"]
    finished_at: Annotated[str | None, "when it reached a final state (timestamp); null before"]
    priority: Annotated[int, "0..100, higher is released first"]
    deadline_at: Annotated[
        str | None, "when it fails ``deadline_exceeded`` if not completed (timestamp); null: none"
    ]
    renderer: Annotated[str, "what renders it: tessera (the built-in kernel), blender or povray"]


@dataclass(frozen=True)
class StatusReply(JobSummary):
    """``tessera.api.status``: the summary, progress, result and last error of one job.

    ``tiles_total`` is 0 until the scheduler has planned the tiles; ``samples_done`` and
    ``samples_total`` count samples per pixel summed over tiles (``spp * tiles_total`` at most).
    """

    idempotency_key: Annotated[str, "the job's idempotency key"]
    input_hash: Annotated[str, "sha256 (hex) of everything that determines the image"]
    tile_size: Annotated[
        int,
        "tile edge, pixels (a tile_size auto job: the edge the scheduler picked; 0 until planned)",
    ]
    tile_auto: Annotated[bool, "the scheduler picked the edge (tile_size auto at submit)"]
    tiles_total: Annotated[int, "tiles of the job (0 until planned)"]
    tiles_done: Annotated[int, "tiles whose result is committed"]
    tiles_by_state: Annotated[dict[str, int], "tile state -> count, states with no tile left out"]
    samples_total: Annotated[int, "spp * tiles_total"]
    samples_done: Annotated[int, "samples per pixel finished, summed over tiles"]
    cancel_requested: Annotated[bool, "a cancel was asked for"]
    result_location: Annotated[
        str | None,
        "object-store key of the PNG, relative to the store's root; null until completed",
    ]
    result_sha256: Annotated[str | None, "sha256 (hex) of the PNG; null until completed"]
    float_location: Annotated[
        str | None,
        "object-store key of the float image (.npy, relative to the root); null until completed",
    ]
    last_error_code: Annotated[str | None, "code of the last failure (e.g. invalid); null if none"]
    last_error: Annotated[str | None, "message of the last failure, for humans; null if none"]
    waiting: Annotated[
        str | None,
        "why its tiles are not being rendered, when the farm knows (no live worker runs its "
        "renderer); null otherwise",
    ]


@dataclass(frozen=True)
class ListReply:
    """``tessera.api.list``: a page of jobs, newest first."""

    jobs: Annotated[list[JobSummary], "the page, newest first"]
    next_cursor: Annotated[str | None, "``cursor`` of the next page; null on the last page"]


@dataclass(frozen=True)
class CancelReply:
    """``tessera.api.cancel``: the cancel is recorded; workers stop at their next pass."""

    job_id: Annotated[str, "the job's id"]
    state: Annotated[str, f"the {_JOB_STATE} now (cancelled)"]
    cancel_requested: Annotated[bool, "always true"]


@dataclass(frozen=True)
class PriorityReply:
    """``tessera.api.priority``: the job's new priority (audited in its trail)."""

    job_id: Annotated[str, "the job's id"]
    state: Annotated[str, f"the {_JOB_STATE} now"]
    priority: Annotated[int, "the priority now"]


@dataclass(frozen=True)
class PauseReply:
    """``tessera.api.pause``: the job is paused; its in-flight tiles checkpoint at their next
    pass boundary and are handed back, nothing more of it is released."""

    job_id: Annotated[str, "the job's id"]
    state: Annotated[str, f"the {_JOB_STATE} now (paused)"]
    tiles_unreleased: Annotated[int, "idle tiles taken back from the queue by this request"]


@dataclass(frozen=True)
class ResumeReply:
    """``tessera.api.resume``: the job runs again; every tile continues from its checkpoint."""

    job_id: Annotated[str, "the job's id"]
    state: Annotated[str, f"the {_JOB_STATE} now (running)"]


@dataclass(frozen=True)
class ProjectView:
    """One project in ``project.list`` / ``project.show``."""

    name: Annotated[str, "project name"]
    configured: Annotated[bool, "false: no settings stored (weight 1, no cap apply)"]
    weight: Annotated[float, "fair-share weight"]
    max_in_flight: Annotated[int | None, "cap on its leased tiles; null: none"]
    queued: Annotated[int, "its live jobs' tiles waiting (queued or failed_retryable)"]
    in_flight: Annotated[int, "its tiles being rendered (leased or progressing)"]
    core_seconds: Annotated[float, "kernel core-seconds its tiles used within the window"]
    share: Annotated[float, "core_seconds over every project's (0..1; 0 when nothing ran)"]


@dataclass(frozen=True)
class ProjectSetReply:
    """``tessera.api.project.set``: the project's settings now (audited with ``actor``)."""

    name: Annotated[str, "project name"]
    weight: Annotated[float, "fair-share weight now"]
    max_in_flight: Annotated[int | None, "cap on its leased tiles now; null: none"]
    actor: Annotated[str, "who the audit row names"]


@dataclass(frozen=True)
class ProjectListReply:
    """``tessera.api.project.list``: every project, by name."""

    projects: Annotated[list[ProjectView], "the projects, by name"]
    window_seconds: Annotated[float, "the share window (``TESSERA_FAIR_SHARE_WINDOW``), seconds"]


@dataclass(frozen=True)
class ProjectShowReply:
    """``tessera.api.project.show``: one project."""

    project: Annotated[ProjectView, "the project"]
    window_seconds: Annotated[float, "the share window (``TESSERA_FAIR_SHARE_WINDOW``), seconds"]


@dataclass(frozen=True)
class RetryReply:
    """``tessera.api.retry``: the job is queued again as a new generation."""

    job_id: Annotated[str, "the job's id"]
    state: Annotated[str, f"the {_JOB_STATE} now (queued)"]
    generation: Annotated[int, "the new generation"]
    replayed: Annotated[bool, "true if this only re-sent an earlier retry whose publish was lost"]


@dataclass(frozen=True)
class ResultReply:
    """``tessera.api.result``: where to download a completed job's image, or a chunk of it.

    Either ``url`` is set (an S3 store, ``inline`` not asked for: GET it before ``expires_at``)
    or ``data_b64`` carries ``length`` bytes from ``offset``; ask again with
    ``offset: next_offset`` until ``next_offset`` is null, then check ``size`` and ``sha256``.
    """

    job_id: Annotated[str, "the job's id"]
    kind: Annotated[ResultKind, "``png`` (the image) or ``float`` (the float image, .npy)"]
    content_type: Annotated[str, "``image/png`` or ``application/x-npy``"]
    size: Annotated[int, "bytes of the whole object"]
    sha256: Annotated[str, "sha256 (hex) of the whole object: verify the download against it"]
    url: Annotated[str | None, "a presigned HTTP GET URL for the whole object; null for chunks"]
    expires_at: Annotated[str | None, "when ``url`` stops working (timestamp); null for chunks"]
    offset: Annotated[int, "byte offset of ``data_b64`` in the object (0 with a url)"]
    length: Annotated[int, "bytes in ``data_b64`` (0 with a url)"]
    data_b64: Annotated[str | None, "base64 of the bytes offset..offset+length; null with a url"]
    next_offset: Annotated[int | None, "offset of the next chunk; null when this was the last"]


@dataclass(frozen=True)
class DeadLetterView:
    """One dead letter in ``dlq.list``; ``error`` is cut to 500 characters here.

    A message in the DLQ stream that is not a Tessera dead letter has only ``seq``, ``subject``
    and ``time`` set, and ``malformed`` says why; the other fields are null.
    """

    seq: Annotated[int, "sequence in the DLQ stream (``dlq.show``'s ``seq``, the list cursor)"]
    subject: Annotated[str, "the dead letter's subject, ``tessera.dlq.<job>.<unit>``"]
    time: Annotated[str | None, "when it was dead-lettered (timestamp)"]
    malformed: Annotated[str | None, "why the message could not be decoded; null for a dead letter"]
    job_id: Annotated[str | None, "the job"]
    unit: Annotated[str | None, "``tile-<i>``, ``job`` or ``final``"]
    reason: Annotated[str | None, "an error code (e.g. ``max_deliveries``, ``invalid``)"]
    error: Annotated[str | None, "the last error, for humans"]
    source_stream: Annotated[str | None, "stream of the original message (e.g. ``TILES``)"]
    source_seq: Annotated[int | None, "its sequence in that stream"]
    deliveries: Annotated[int | None, "deliveries before it was dead-lettered"]
    original_subject: Annotated[str | None, "the original message's subject"]


@dataclass(frozen=True)
class DeadLetterDetail(DeadLetterView):
    """One dead letter in ``dlq.show``: ``error`` whole, and the original message."""

    payload_b64: Annotated[
        str | None, "base64 of the original message (msgpack); null if malformed"
    ]


@dataclass(frozen=True)
class RequeueView:
    """One dead letter in a ``dlq.requeue`` report."""

    seq: Annotated[int, "sequence in the DLQ stream"]
    job_id: Annotated[str, "the job"]
    unit: Annotated[str, "``tile-<i>``, ``job`` or ``final``"]
    reason: Annotated[str, "why it was dead-lettered (an error code)"]
    error: Annotated[str, "the last error, cut to 500 characters"]
    action: Annotated[str, "``requeue``, ``replay`` or ``skip``"]
    why: Annotated[str, "the reason for ``action``, for humans"]
    tile: Annotated[int | None, "tile index for a tile unit; null otherwise"]
    generation: Annotated[int | None, "generation published (or to be, in a dry run); null if none"]
    done: Annotated[bool, "true once acted on (always false in a dry run)"]


@dataclass(frozen=True)
class DlqListReply:
    """``tessera.api.dlq.list``: a page of dead letters, oldest first."""

    dead_letters: Annotated[list[DeadLetterView], "the page, oldest first"]
    next_cursor: Annotated[str | None, "``cursor`` of the next page; null on the last page"]


@dataclass(frozen=True)
class DlqShowReply:
    """``tessera.api.dlq.show``: one dead letter."""

    dead_letter: Annotated[DeadLetterDetail, "the letter, with its original payload"]


@dataclass(frozen=True)
class DlqRequeueReply:
    """``tessera.api.dlq.requeue``: what was (or in a dry run would be) requeued."""

    dry_run: Annotated[bool, "true if nothing was changed"]
    requeued: Annotated[int, "letters acted on (requeued or replayed)"]
    skipped: Annotated[int, "letters left alone"]
    examined: Annotated[int, "letters looked at (requeued + skipped)"]
    dead_letters: Annotated[list[RequeueView], "the leading letters, as many as fit in one reply"]
    omitted: Annotated[int, "letters examined but not listed (the reply's size bound)"]
    missing: Annotated[
        list[int],
        "of the seqs asked for, those that are not dead letters (of job_id): already requeued "
        "or purged, or never one",
    ] = field(default_factory=list)


@dataclass(frozen=True)
class DlqPurgeReply:
    """``tessera.api.dlq.purge``: dead letters deleted."""

    purged: Annotated[int, "letters deleted (0 in a dry run)"]
    matched: Annotated[int, "letters matching the request just before the purge"]
    dry_run: Annotated[bool, "true if nothing was deleted"]


@dataclass(frozen=True)
class AssetMissingReply:
    """``tessera.api.asset.missing``: the chunks to upload, and the limits to upload within."""

    missing: Annotated[list[str], "the digests asked about that are not stored, in order"]
    chunk_bytes: Annotated[int, "bytes of every chunk of a file but its last (4 MiB)"]
    max_asset_bytes: Annotated[int, "the most bytes all files of one asset may have"]
    max_query: Annotated[int, "the most digests one ``asset.missing`` request may ask about"]


@dataclass(frozen=True)
class AssetChunkReply:
    """``tessera.api.asset.chunk``: the chunk is stored (by this request or an earlier one)."""

    sha256: Annotated[str, "the chunk's sha256 (hex)"]
    size: Annotated[int, "its bytes"]
    stored: Annotated[bool, "true if this request wrote it, false if it was already stored"]


@dataclass(frozen=True)
class AssetManifestReply:
    """``tessera.api.asset.manifest``: the asset's reference, to name in a submit."""

    asset: Annotated[str, "sha256 (hex) of the manifest's canonical JSON: the asset's reference"]
    main: Annotated[str, "the main scene file's path in the asset"]
    files: Annotated[int, "files in the asset"]
    size: Annotated[int, "bytes of all its files"]
    stored: Annotated[bool, "true if this request wrote the manifest, false if already stored"]


TILE_COLUMNS = (
    "index", "x", "y", "w", "h", "state", "samples_done", "spp", "attempts", "takeovers",
    "resumes", "last_error_code", "last_error", "node",
)  # fmt: skip
"""The columns of a ``job.tiles`` row, in order (``columns`` in the reply)."""

TILE_COLUMN_DOCS = (
    "``index`` tile index; ``x``, ``y``, ``w``, ``h`` its rectangle in pixels (row 0 at the "
    "top); ``state`` its tile state; ``samples_done`` samples per pixel recorded (at the last "
    "checkpoint, or ``spp`` once done); ``spp`` the job's samples per pixel; ``attempts`` "
    "attempts started (leases taken); ``takeovers`` leases taken from an owner that stopped "
    "renewing (audit rows ``lease_expired``); ``resumes`` attempts that resumed from a "
    "checkpoint; ``last_error_code``, ``last_error`` (cut to 200 characters) the tile's last "
    "failure or null; ``node`` the worker holding it now (an open attempt under the tile's "
    "fence), null when none"
)


@dataclass(frozen=True)
class JobTilesReply:
    """``tessera.api.job.tiles``: a job's tiles, one row per tile in index order.

    Each row is an array of the values named by ``columns`` (always :data:`TILE_COLUMNS`,
    in that order; see the field's text), compact so a 4,096-tile job fits in one reply
    (70 to 90 bytes a row). When the rows do not all fit (a larger job, or long error texts
    on many tiles), the page ends early and
    ``next_offset`` is the ``offset`` of the next page.
    """

    job_id: Annotated[str, "the job's id"]
    width: Annotated[int, "image width, pixels"]
    height: Annotated[int, "image height, pixels"]
    tile_size: Annotated[int, "tile edge, pixels"]
    renderer: Annotated[str, "what renders it (tessera, blender or povray)"]
    state: Annotated[str, f"the {_JOB_STATE} now"]
    spp: Annotated[int, "samples per pixel requested"]
    tiles_total: Annotated[int, "tiles of the job (0 until planned)"]
    columns: Annotated[list[str], "the names of a row's values, in order: " + TILE_COLUMN_DOCS]
    tiles: Annotated[list[list[int | str | None]], "the rows, in index order from ``offset``"]
    offset: Annotated[int, "tile index of the first row"]
    next_offset: Annotated[int | None, "``offset`` of the next page; null on the last page"]


@dataclass(frozen=True)
class TimelineEvent:
    """One row of a job's audit trail in ``job.timeline``; ``error`` cut to 500 characters."""

    id: Annotated[int, "the row's id (increasing; ``before_id`` pages by it)"]
    at: Annotated[str, "when it happened (timestamp)"]
    kind: Annotated[str, "what happened: the trigger (``lease``, ``commit``, ``pause``, ...)"]
    entity: Annotated[str, "``job`` or ``tile``"]
    tile_index: Annotated[int | None, "the tile, for a tile row; null for a job row"]
    attempt_id: Annotated[str | None, "the attempt that caused it, if any"]
    node: Annotated[str, "the process that wrote it (a worker's node, ``gateway:...``); may be ''"]
    from_state: Annotated[str | None, "state before (null for the job's creation)"]
    to_state: Annotated[str, "state after"]
    detail: Annotated[str | None, "more about it, for humans"]
    error_code: Annotated[str | None, "the error code, for a failure or a takeover"]
    error: Annotated[str | None, "the error message, for humans"]


@dataclass(frozen=True)
class JobTimelineReply:
    """``tessera.api.job.timeline``: a page of the job's audit trail, newest first."""

    job_id: Annotated[str, "the job's id"]
    events: Annotated[list[TimelineEvent], "the page, newest first"]
    next_before_id: Annotated[
        int | None, "``before_id`` of the next (older) page; null on the last page"
    ]


@dataclass(frozen=True)
class JobPreviewReply:
    """``tessera.api.job.preview``: the image so far as a PNG.

    Assembled from the committed tiles and the latest checkpoint of each unfinished tile, each
    tone-mapped as the finalizer does (the mean of its own samples), dark grey where nothing is
    rendered yet, downscaled to fit ``max_edge`` (and smaller still if its PNG would not fit in
    one reply). The gateway caches it per job and ``max_edge`` and encodes it again at most
    once a second, only when ``version`` changed: ask as often as you like.
    """

    job_id: Annotated[str, "the job's id"]
    width: Annotated[int, "the PNG's width, pixels"]
    height: Annotated[int, "the PNG's height, pixels"]
    tiles_done: Annotated[int, "tiles committed when it was encoded"]
    tiles_total: Annotated[int, "tiles of the job (0 until planned)"]
    samples_done: Annotated[int, "samples per pixel recorded, summed over tiles"]
    samples_total: Annotated[int, "spp * tiles_total"]
    content_type: Annotated[str, "``image/png``"]
    data_b64: Annotated[str, "base64 of the PNG"]
    version: Annotated[
        str, "changes whenever what the image is made of changes (an ETag for the image)"
    ]
    max_edge: Annotated[int, "the ``max_edge`` asked for"]
    encoded_at: Annotated[str, "when this PNG was encoded (timestamp)"]


@dataclass(frozen=True)
class WorkerView:
    """One live worker in ``workers``, as it announces itself every 2 s."""

    node: Annotated[str, "the worker's node name"]
    threads: Annotated[int, "kernel threads"]
    in_hand: Annotated[int, "tiles it holds now"]
    renderers: Annotated[dict[str, str], "renderer name -> version, of the renderers it runs"]
    version: Annotated[str, "Tessera's version on it"]
    started_at: Annotated[str, "when it started (timestamp)"]
    uptime_s: Annotated[float, "seconds since it started"]
    current_tiles: Annotated[
        list[list[str | int]], "``[job_id, tile_index]`` of each tile it holds"
    ]


@dataclass(frozen=True)
class WorkersReply:
    """``tessera.api.workers``: the live workers, by node (a worker that stopped refreshing
    drops out within 10 s)."""

    workers: Annotated[list[WorkerView], "the workers, by node"]
    threads: Annotated[int, "their kernel threads, summed"]
    at: Annotated[str, "when the bucket was read (timestamp)"]


@dataclass(frozen=True)
class FarmReply:
    """``tessera.api.farm``: the farm's operational numbers.

    Depths and ages are read from JetStream now; rates, counts and latencies from the audit
    trail over the last ``window_s`` seconds (attempts that ended in the window). A ratio with
    nothing to count is 0, a latency with nothing to measure null.
    """

    queue_depth: Annotated[
        int,
        "tiles waiting to render: messages the renderers' ``TILES`` consumers have not yet "
        "delivered, plus queued tiles the dispatcher has not released yet",
    ]
    oldest_age_s: Annotated[
        float, "seconds the oldest unacknowledged message of any durable consumer has waited"
    ]
    in_flight: Annotated[int, "tiles delivered and not yet acknowledged (``TILES`` ack pending)"]
    retry_rate: Annotated[
        float, "tile attempts ended ``retryable`` over tile attempts ended, in the window (0..1)"
    ]
    duplicates_suppressed: Annotated[
        int,
        "tile attempts whose commit the fence refused (``fenced``: another owner had committed "
        "or held the tile), in the window",
    ]
    lease_renewal_failures: Annotated[
        int, "tile and finalization attempts ended ``lease_lost``, in the window"
    ]
    resume_rate: Annotated[
        float, "tile attempts ended in the window that resumed from a checkpoint (0..1)"
    ]
    latency_p50_s: Annotated[
        float | None, "median seconds of a tile attempt, lease to commit (ended ``done``)"
    ]
    latency_p95_s: Annotated[float | None, "95th percentile of the same"]
    latency_p99_s: Annotated[float | None, "99th percentile of the same"]
    dlq_size: Annotated[int, "messages in the ``DLQ`` stream"]
    finalization_failures: Annotated[
        int, "finalization attempts ended otherwise than ``done``, in the window"
    ]
    window_s: Annotated[int, "the window, seconds"]
    at: Annotated[str, "when the numbers were read (timestamp)"]


VERB_REPLIES: dict[ApiVerb, type] = {
    ApiVerb.SUBMIT: SubmitReply,
    ApiVerb.STATUS: StatusReply,
    ApiVerb.LIST: ListReply,
    ApiVerb.CANCEL: CancelReply,
    ApiVerb.RETRY: RetryReply,
    ApiVerb.RESULT: ResultReply,
    ApiVerb.DLQ_LIST: DlqListReply,
    ApiVerb.DLQ_SHOW: DlqShowReply,
    ApiVerb.DLQ_REQUEUE: DlqRequeueReply,
    ApiVerb.DLQ_PURGE: DlqPurgeReply,
    ApiVerb.PRIORITY: PriorityReply,
    ApiVerb.PAUSE: PauseReply,
    ApiVerb.RESUME: ResumeReply,
    ApiVerb.PROJECT_SET: ProjectSetReply,
    ApiVerb.PROJECT_LIST: ProjectListReply,
    ApiVerb.PROJECT_SHOW: ProjectShowReply,
    ApiVerb.ASSET_MISSING: AssetMissingReply,
    ApiVerb.ASSET_CHUNK: AssetChunkReply,
    ApiVerb.ASSET_MANIFEST: AssetManifestReply,
    ApiVerb.JOB_TILES: JobTilesReply,
    ApiVerb.JOB_TIMELINE: JobTimelineReply,
    ApiVerb.JOB_PREVIEW: JobPreviewReply,
    ApiVerb.WORKERS: WorkersReply,
    ApiVerb.FARM: FarmReply,
}
"""The reply schema of every verb."""

ITEM_SCHEMAS: tuple[type, ...] = (
    JobSummary, DeadLetterView, DeadLetterDetail, RequeueView, ProjectView, TimelineEvent,
    WorkerView,
)  # fmt: skip
"""Schemas that appear inside replies (list items)."""

REPLY_SCHEMAS: tuple[type, ...] = (*VERB_REPLIES.values(), *ITEM_SCHEMAS)

Reply = (
    SubmitReply | StatusReply | ListReply | CancelReply | RetryReply | ResultReply
    | DlqListReply | DlqShowReply | DlqRequeueReply | DlqPurgeReply | PriorityReply
    | PauseReply | ResumeReply | ProjectSetReply | ProjectListReply | ProjectShowReply
    | AssetMissingReply | AssetChunkReply | AssetManifestReply | JobTilesReply
    | JobTimelineReply | JobPreviewReply | WorkersReply | FarmReply
)  # fmt: skip


def reply_fields(schema: type) -> tuple[str, ...]:
    """The field names of a reply schema, in order."""
    return tuple(f.name for f in dataclasses.fields(schema))


def field_docs(schema: type) -> dict[str, tuple[Any, str]]:
    """Each field's type and its documentation (the text in its ``Annotated``)."""
    hints = get_type_hints(schema, include_extras=True)
    out = {}
    for name in reply_fields(schema):
        base, text = hints[name].__origin__, hints[name].__metadata__[0]
        out[name] = (base, str(text))
    return out


def encode_reply(reply: Reply) -> bytes:
    """The JSON of ``{"ok": true, **reply}`` (nested schemas become objects)."""
    return ok_reply(**dataclasses.asdict(reply))
