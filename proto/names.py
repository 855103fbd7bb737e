"""Every subject, stream, consumer, bucket, key and message-id pattern, named once.

Identifiers that appear inside subjects and keys must be *tokens*: 1..64 characters from
``[A-Za-z0-9_-]`` (no dots, wildcards or whitespace). Job ids are UUIDv7 strings (36 characters,
lowercase hex with dashes), which are valid tokens and sort by creation time.

Prefix-independent names live here as module functions (message ids, KV keys: they are scoped by
their stream or bucket). Prefixed names (subjects, stream and bucket names) are methods of
:class:`Names`, so a test topology ``Names("t123")`` is disjoint from every other one:

==================  ==============================  =========================================
kind                default (``Names()``)           ``Names("t123")``
==================  ==============================  =========================================
stream              ``TILES``                       ``t123_TILES``
subject             ``tessera.tiles.<r>.<job>.<i>`` ``t123.tessera.tiles.<r>.<job>.<i>``
KV bucket           ``tessera-leases``              ``t123_tessera-leases``
queue group         ``tessera-gateway``             ``t123_tessera-gateway``
consumer            ``workers``                     ``workers`` (scoped by its stream)
==================  ==============================  =========================================

A tile's subject names its job's renderer ``<r>`` (``tessera``, ``blender``, ``povray``): each
renderer has its own durable consumer on ``TILES`` (:func:`workers_consumer`), filtered to its
subjects, and a worker binds only the consumers of the renderers it has.

Message ids (``Nats-Msg-Id``): ``job:<job>:<gen>`` (``job:<job>:<gen>:swept:<stamp>`` when the
sweeper re-publishes it), ``tile:<job>:<i>:<gen>``, ``done:<job>:<i>:<fence>`` (the committing
owner's token), ``event:<job>:<kind>:<gen>``, ``dlq:<source stream>:<source seq>``.
KV keys: leases ``tile.<job>.<i>`` and ``final.<job>``; progress ``tile.<job>.<i>``.

Readable headers (``Tessera-*``, see :data:`HDR_KIND` and below) ride on every internal message
next to ``Nats-Msg-Id`` so ``nats stream view`` shows what a msgpack body is. They are for people:
Tessera never reads them back, the body stays the only source of truth.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum

from shared.core.errors import ValidationError

TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a job id, DLQ unit or prefix must match (a NATS subject token that is also a key part)."""

STREAM_JOBS = "JOBS"
STREAM_TILES = "TILES"
STREAM_EVENTS = "EVENTS"
STREAM_DLQ = "DLQ"
STREAM_ADVISORIES = "ADVISORIES"

CONSUMER_SCHEDULER_JOBS = "scheduler-jobs"
CONSUMER_WORKERS = "workers"
"""The ``tessera`` renderer's consumer on TILES (the name it had before renderers, so a running
deployment keeps its consumer: :func:`workers_consumer`)."""
CONSUMER_FINALIZER = "finalizer"
CONSUMER_SCHEDULER_ADVISORIES = "scheduler-advisories"

BUCKET_LEASES = "tessera-leases"
BUCKET_PROGRESS = "tessera-progress"
BUCKET_WORKERS = "tessera-workers"

QUEUE_GROUP_GATEWAY = "tessera-gateway"
QUEUE_GROUP_READ_AHEAD = "tessera-finalizer-read-ahead"
"""Queue group the finalizers share on the tile-done events (each result read ahead once)."""

HDR_KIND = "Tessera-Kind"
"""Header: what the message is: ``job``, ``tile``, an :class:`EventKind` or ``dead-letter``."""
HDR_JOB = "Tessera-Job"
"""Header: the job id."""
HDR_TILE = "Tessera-Tile"
"""Header: the tile index (tile messages, tile-done events, dead letters of a tile)."""
HDR_GENERATION = "Tessera-Generation"
"""Header: the job or tile generation (JOBS, TILES, job events)."""
HDR_RUN = "Tessera-Run"
"""Header: how many tiles a TILES message carries, when more than one (a run)."""
HDR_ATTEMPT = "Tessera-Attempt"
"""Header: the attempt whose result a tile-done event reports."""
HDR_UNIT = "Tessera-Unit"
"""Header of a dead letter: ``tile-<i>``, ``job`` or ``final``."""
HDR_REASON = "Tessera-Reason"
"""Header of a dead letter: its error code (``max_deliveries``, ``invalid``, ...)."""
HDR_SOURCE = "Tessera-Source"
"""Header of a dead letter: ``<stream>:<sequence>`` of the original message."""
HDR_DELIVERIES = "Tessera-Deliveries"
"""Header of a dead letter: how many times the original was delivered."""

KIND_JOB = "job"
KIND_TILE = "tile"
KIND_DEAD_LETTER = "dead-letter"
KIND_ROOM = "room"

DLQ_UNIT_JOB = "job"
DLQ_UNIT_FINAL = "final"


class EventKind(StrEnum):
    """The last token of an ``EVENTS`` subject."""

    TILE_DONE = "tile-done"
    TILES_DONE = "tiles-done"
    JOB_COMPLETED = "job-completed"
    JOB_FAILED = "job-failed"
    JOB_CANCELLED = "job-cancelled"
    JOB_PAUSED = "job-paused"
    JOB_RESUMED = "job-resumed"
    JOB_DEAD_LETTERED = "job-dead-lettered"
    JOB_RETRIED = "job-retried"


DISPATCH_NUDGES = (
    EventKind.JOB_RESUMED,
    EventKind.JOB_PAUSED,
    EventKind.JOB_CANCELLED,
    EventKind.JOB_FAILED,
    EventKind.JOB_DEAD_LETTERED,
    EventKind.JOB_RETRIED,
)
"""The job events every dispatcher hears besides tile-done: each may make tiles releasable (a
resume, a retry) or free room in a window (a pause, cancel, failure or dead letter)."""


class ApiVerb(StrEnum):
    """The API verbs; the subject is ``tessera.api.<verb>``."""

    SUBMIT = "submit"
    STATUS = "status"
    CANCEL = "cancel"
    LIST = "list"
    RETRY = "retry"
    RESULT = "result"
    DLQ_LIST = "dlq.list"
    DLQ_SHOW = "dlq.show"
    DLQ_REQUEUE = "dlq.requeue"
    DLQ_PURGE = "dlq.purge"
    PRIORITY = "priority"
    PAUSE = "pause"
    RESUME = "resume"
    PROJECT_SET = "project.set"
    PROJECT_LIST = "project.list"
    PROJECT_SHOW = "project.show"
    ASSET_MISSING = "asset.missing"
    ASSET_CHUNK = "asset.chunk"
    ASSET_MANIFEST = "asset.manifest"
    JOB_TILES = "job.tiles"
    JOB_TIMELINE = "job.timeline"
    JOB_PREVIEW = "job.preview"
    WORKERS = "workers"
    FARM = "farm"


RENDERER_TESSERA = "tessera"
"""The numba kernel's renderer name, the default of ``jobs.renderer``."""

RENDERERS = (RENDERER_TESSERA, "blender", "povray")
"""Every renderer Tessera knows (one TILES consumer each)."""

DISPLAY_REFERRED_RENDERERS = frozenset({"povray"})
"""Renderers whose accumulators hold display-referred values (POV-Ray's gamma-encoded 16-bit
values): their images are not tone-mapped (:mod:`kernel.image`)."""


def workers_consumer(renderer: str) -> str:
    """The durable consumer on TILES of one renderer's tiles: ``workers`` for ``tessera`` (its
    name before renderers existed), ``workers-<renderer>`` for the others."""
    check_token(renderer, "renderer")
    return CONSUMER_WORKERS if renderer == RENDERER_TESSERA else f"{CONSUMER_WORKERS}-{renderer}"


def job_of_tile_subject(subject: str) -> str | None:
    """The job id a ``TILES`` subject (``[<prefix>.]tessera.tiles.<renderer>.<job>.<i>``, or the
    form before renderers, ``...tessera.tiles.<job>.<i>``) names, if any.

    For a message whose body cannot be decoded: its dead letter still names the job.
    """
    parts = subject.split(".")
    if len(parts) < 4 or _indexes(parts[-1]) is None:
        return None
    current = len(parts) >= 5 and parts[-5:-3] == ["tessera", "tiles"]
    if not (current or parts[-4:-2] == ["tessera", "tiles"]):
        return None
    job = parts[-2]
    return job if TOKEN_RE.fullmatch(job) else None


def tile_of_subject(subject: str) -> tuple[str, int] | None:
    """``(job, tile index)`` of a one-tile ``TILES`` subject of the current form, or ``None``."""
    parts = subject.split(".")
    if len(parts) >= 5 and parts[-5:-3] == ["tessera", "tiles"] and parts[-1].isdigit():
        return parts[-2], int(parts[-1])
    return None


def tiles_of_subject(subject: str) -> tuple[str, range] | None:
    """``(job, tile indexes)`` of a ``TILES`` subject of the current form, one tile's
    (``...<job>.<i>``) or a run's (``...<job>.<first>-<last>``), or ``None``."""
    parts = subject.split(".")
    if len(parts) < 5 or parts[-5:-3] != ["tessera", "tiles"]:
        return None
    indexes = _indexes(parts[-1])
    return None if indexes is None else (parts[-2], indexes)


def _indexes(token: str) -> range | None:
    """The tiles a subject's last token names: ``<i>`` or ``<first>-<last>``."""
    first, dash, last = token.partition("-")
    if not first.isdigit() or (dash and not last.isdigit()):
        return None
    end = int(last) if dash else int(first)
    return range(int(first), end + 1) if end >= int(first) else None


def check_token(value: str, what: str) -> str:
    """Return ``value`` if it is a subject-safe token, else raise :class:`ValidationError`."""
    if not isinstance(value, str) or TOKEN_RE.fullmatch(value) is None:
        raise ValidationError(f"{what}: {value!r} is not a token matching {TOKEN_RE.pattern}")
    return value


def check_index(value: int, what: str) -> int:
    """Return ``value`` if it is a non-negative int (not a bool), else raise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"{what}: {value!r} is not a non-negative integer")
    return value


def check_run(run: int) -> int:
    """Return ``run`` (tiles a TILES message carries) if it is a positive int, else raise."""
    if isinstance(run, bool) or not isinstance(run, int) or run < 1:
        raise ValidationError(f"run: {run!r} is not a positive integer")
    return run


def new_job_id() -> str:
    """A fresh UUIDv7 (RFC 9562) string: time-ordered, random-tailed, subject-safe."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & (2**48 - 1)) << 80 | 0x7 << 76 | (rand >> 68) << 64
    value |= 0b10 << 62 | rand & (2**62 - 1)
    return str(uuid.UUID(int=value))


def new_attempt_id() -> str:
    """A fresh attempt id: :func:`new_job_id`'s UUIDv7 as 32 hex digits (the shape of
    ``uuid4().hex``). Time-ordered, so the attempts table's primary key grows at its end
    instead of at a random leaf for every tile."""
    return new_job_id().replace("-", "")


def dlq_unit_tile(tile_index: int) -> str:
    """The DLQ unit token for one tile: ``tile-<i>``."""
    return f"tile-{check_index(tile_index, 'tile_index')}"


def job_msg_id(job_id: str, generation: int) -> str:
    """``Nats-Msg-Id`` of a ``JOBS`` message; a retry publishes a new generation."""
    return f"job:{check_token(job_id, 'job_id')}:{check_index(generation, 'generation')}"


def swept_job_msg_id(job_id: str, generation: int, stamp: int) -> str:
    """``Nats-Msg-Id`` of a JOBS message the sweeper re-publishes because none is in the stream.

    The original id may still sit in the duplicate window even though its message is gone (a
    work-queue stream remembers ids it already consumed), so the copy carries the sweep time.
    """
    return f"{job_msg_id(job_id, generation)}:swept:{check_index(stamp, 'stamp')}"


def tile_msg_id(job_id: str, tile_index: int, generation: int, run: int = 1) -> str:
    """``Nats-Msg-Id`` of a ``TILES`` message; the sweeper re-publishes with a new generation.

    A message carrying a run of ``run`` tiles from ``tile_index`` ends in ``:<run>``: the same
    tiles under the same generation are always the same message.
    """
    job = check_token(job_id, "job_id")
    msg_id = f"tile:{job}:{check_index(tile_index, 'tile_index')}:{check_index(generation, 'gen')}"
    return msg_id if check_run(run) == 1 else f"{msg_id}:{run}"


def done_msg_id(job_id: str, tile_index: int, fence: int) -> str:
    """``Nats-Msg-Id`` of a tile-done event: one fact per committed result, whoever reports it.

    ``fence`` is the token of the owner whose commit it reports (the tile row's ``lease_fence``):
    a re-announce of the same commit is a duplicate, a tile rendered again after its result was
    lost is a new fact.
    """
    job, tile = check_token(job_id, "job_id"), check_index(tile_index, "tile_index")
    return f"done:{job}:{tile}:{check_index(fence, 'fence')}"


def alldone_msg_id(job_id: str, completion: int) -> str:
    """``Nats-Msg-Id`` of a tiles-done event: one fact per completion of a job's tiles.

    ``completion`` is the newest ``lease_fence`` among the job's done tiles when every tile was
    seen done: two workers that see the same completion report one fact; a completion after
    tiles were rendered again (their results lost) has a newer fence, so it is a new fact.
    """
    job = check_token(job_id, "job_id")
    return f"alldone:{job}:{check_index(completion, 'completion')}"


def event_msg_id(job_id: str, kind: EventKind, generation: int) -> str:
    """``Nats-Msg-Id`` of a job event (completed, failed, ...) of one job generation."""
    job = check_token(job_id, "job_id")
    return f"event:{job}:{EventKind(kind).value}:{check_index(generation, 'generation')}"


def dlq_msg_id(source_stream: str, source_seq: int) -> str:
    """``Nats-Msg-Id`` of a DLQ copy: keyed by the original message, so re-copying is absorbed."""
    stream = check_token(source_stream, "source_stream")
    return f"dlq:{stream}:{check_index(source_seq, 'source_seq')}"


def lease_key_tile(job_id: str, tile_index: int) -> str:
    """Key of a tile lease in the leases bucket: ``tile.<job>.<i>``."""
    return f"tile.{check_token(job_id, 'job_id')}.{check_index(tile_index, 'tile_index')}"


def lease_keys_of_job(job_id: str) -> str:
    """Wildcard over the tile lease keys of one job: ``tile.<job>.*`` (the sweeper's scan)."""
    return f"tile.{check_token(job_id, 'job_id')}.*"


def lease_key_final(job_id: str) -> str:
    """Key of a job's finalization lease in the leases bucket: ``final.<job>``."""
    return f"final.{check_token(job_id, 'job_id')}"


def worker_key(node: str) -> str:
    """Key of a live worker in the workers bucket: ``worker.<node>`` (a node name that is not
    a key token has its other characters replaced by ``_``)."""
    return f"worker.{re.sub(r'[^-/_=a-zA-Z0-9]', '_', node) or '_'}"


WORKER_KEYS = "worker.*"
"""Wildcard over the live-worker keys of the workers bucket."""


def progress_key(job_id: str, tile_index: int) -> str:
    """Key of a tile's progress pointer in the progress bucket: ``tile.<job>.<i>``."""
    return lease_key_tile(job_id, tile_index)


@dataclass(frozen=True)
class Names:
    """Prefixed names of one topology; ``prefix=""`` gives the production names."""

    prefix: str = ""

    def __post_init__(self) -> None:
        if self.prefix:
            check_token(self.prefix, "prefix")

    def _subject(self, rest: str) -> str:
        return f"{self.prefix}.{rest}" if self.prefix else rest

    def _name(self, base: str) -> str:
        return f"{self.prefix}_{base}" if self.prefix else base

    def stream(self, base: str) -> str:
        """Stream name for a base name such as :data:`STREAM_TILES`."""
        return self._name(base)

    def bucket(self, base: str) -> str:
        """KV bucket name for a base name such as :data:`BUCKET_LEASES`."""
        return self._name(base)

    @property
    def queue_group(self) -> str:
        """Queue group the gateways share on the API subjects."""
        return self._name(QUEUE_GROUP_GATEWAY)

    @property
    def read_ahead_group(self) -> str:
        """Queue group the finalizers share on the tile-done events (their read-ahead)."""
        return self._name(QUEUE_GROUP_READ_AHEAD)

    @property
    def jobs_subjects(self) -> str:
        """Wildcard captured by the ``JOBS`` stream."""
        return self._subject("tessera.jobs.>")

    @property
    def tiles_subjects(self) -> str:
        """Wildcard captured by the ``TILES`` stream."""
        return self._subject("tessera.tiles.>")

    @property
    def events_subjects(self) -> str:
        """Wildcard captured by the ``EVENTS`` stream."""
        return self._subject("tessera.events.>")

    @property
    def tile_done_filter(self) -> str:
        """Every job's tile-done events (the dispatcher's nudges, the finalizer's read-ahead)."""
        return self._subject(f"tessera.events.*.{EventKind.TILE_DONE.value}")

    @property
    def tiles_done_filter(self) -> str:
        """Filter of the finalizer consumer: every job's tiles-done events."""
        return self._subject(f"tessera.events.*.{EventKind.TILES_DONE.value}")

    @property
    def room_subject(self) -> str:
        """Core-NATS subject of the workers' :class:`~proto.messages.Room` messages to the
        dispatchers (no stream captures it: a hint, like a tile-done nudge)."""
        return self._subject("tessera.room")

    @property
    def dlq_subjects(self) -> str:
        """Wildcard captured by the ``DLQ`` stream."""
        return self._subject("tessera.dlq.>")

    @property
    def api_subjects(self) -> str:
        """Wildcard the gateway subscribes to."""
        return self._subject("tessera.api.>")

    def job_subject(self, job_id: str) -> str:
        """Subject of a job's ``JOBS`` message."""
        return self._subject(f"tessera.jobs.{check_token(job_id, 'job_id')}")

    def tile_subject(
        self, job_id: str, tile_index: int, renderer: str = RENDERER_TESSERA, run: int = 1
    ) -> str:
        """Subject of one tile's ``TILES`` message: ``tessera.tiles.<renderer>.<job>.<i>``; of a
        run of ``run`` tiles from ``tile_index``: ``...<job>.<first>-<last>``."""
        job, r = check_token(job_id, "job_id"), check_token(renderer, "renderer")
        first = check_index(tile_index, "tile_index")
        tiles = str(first) if check_run(run) == 1 else f"{first}-{first + run - 1}"
        return self._subject(f"tessera.tiles.{r}.{job}.{tiles}")

    def tile_subjects_of(self, job_id: str) -> str:
        """Wildcard over one job's ``TILES`` subjects, whatever its renderer (the sweeper's
        scan): ``tessera.tiles.*.<job>.*``."""
        return self._subject(f"tessera.tiles.*.{check_token(job_id, 'job_id')}.*")

    def renderer_tiles(self, renderer: str) -> str:
        """Filter of one renderer's consumer: ``tessera.tiles.<renderer>.>``."""
        return self._subject(f"tessera.tiles.{check_token(renderer, 'renderer')}.>")

    @property
    def legacy_tile_subjects(self) -> str:
        """Tile subjects of the form before renderers (``tessera.tiles.<job>.<i>``): no
        consumer reads them any more; :func:`~shared.nats.ensure.ensure_topology` purges them
        and the sweeper re-publishes their tiles under their renderer's subject."""
        return self._subject("tessera.tiles.*.*")

    def event_subject(self, job_id: str, kind: EventKind) -> str:
        """Subject of one event of a job; watchers use ``tessera.events.<job>.>``."""
        job = check_token(job_id, "job_id")
        return self._subject(f"tessera.events.{job}.{EventKind(kind).value}")

    def event_filter(self, kind: EventKind) -> str:
        """Wildcard subject of one kind of event of every job (``tessera.events.*.<kind>``)."""
        return self._subject(f"tessera.events.*.{EventKind(kind).value}")

    def dlq_subject(self, job_id: str, unit: str) -> str:
        """Subject of a dead letter; ``unit`` is ``tile-<i>``, ``job`` or ``final``."""
        job = check_token(job_id, "job_id")
        return self._subject(f"tessera.dlq.{job}.{check_token(unit, 'unit')}")

    def api_subject(self, verb: ApiVerb) -> str:
        """Request subject of one API verb."""
        return self._subject(f"tessera.api.{ApiVerb(verb).value}")

    def max_deliveries_advisory(self, stream_base: str) -> str:
        """Advisory subjects for exhausted deliveries on any consumer of one of our streams."""
        return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.stream(stream_base)}.>"
