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
                                              dead_letters, omitted
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
========================  ==================  ==============================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

from proto.api import ResultKind
from proto.names import ApiVerb
from proto.replies import ok_reply

__all__ = ["REPLY_SCHEMAS", "VERB_REPLIES", "encode_reply", "field_docs", "reply_fields"]


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
}
"""The reply schema of every verb."""

ITEM_SCHEMAS: tuple[type, ...] = (
    JobSummary, DeadLetterView, DeadLetterDetail, RequeueView, ProjectView
)  # fmt: skip
"""Schemas that appear inside replies (list items)."""

REPLY_SCHEMAS: tuple[type, ...] = (*VERB_REPLIES.values(), *ITEM_SCHEMAS)

Reply = (
    SubmitReply | StatusReply | ListReply | CancelReply | RetryReply | ResultReply
    | DlqListReply | DlqShowReply | DlqRequeueReply | DlqPurgeReply | PriorityReply
    | PauseReply | ResumeReply | ProjectSetReply | ProjectListReply | ProjectShowReply
    | AssetMissingReply | AssetChunkReply | AssetManifestReply
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
