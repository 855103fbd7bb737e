"""The typed rows of the metadata store: frozen dataclasses, states as lifecycle enums."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar

from asyncpg import Record

from kernel.rect import Rect
from shared.core.errors import ValidationError
from shared.core.fields import field_names
from shared.core.lifecycle import JobState, TileState

SUBMIT_TRIGGER = "submit"
"""The ``trigger`` of a job's first audit row (``NULL → queued``); not a lifecycle event."""


class CommitOutcome(StrEnum):
    """What a fenced tile commit did."""

    #: this call moved the tile to ``done``
    COMMITTED = "committed"
    #: the tile was already ``done`` (a duplicate commit); nothing changed
    ALREADY_DONE = "already_done"
    #: the caller's fencing token is not the tile's: a newer owner holds it; nothing changed
    FENCED = "fenced"


class AttemptOutcome(StrEnum):
    """How one attempt (one execution of a tile or a finalization) ended."""

    DONE = "done"
    RETRYABLE = "retryable"
    TERMINAL = "terminal"
    LEASE_LOST = "lease_lost"
    HANDED_BACK = "handed_back"
    CANCELLED = "cancelled"
    FENCED = "fenced"
    #: the job was paused: checkpoint written, tile back to queued and unreleased
    PAUSED = "paused"


@dataclass(frozen=True)
class NewJob:
    """A job to submit; ``request`` is the normalised body ``fingerprint`` hashes."""

    job_id: str
    idempotency_key: str
    fingerprint: str
    project: str
    request: dict[str, Any]
    scene: dict[str, Any]
    frame: int
    input_hash: str
    width: int
    height: int
    spp: int
    tile_size: int
    #: 0..100, higher released first
    priority: int = 50
    #: past it the job ends ``failed_terminal`` with ``deadline_exceeded``; None: no deadline
    deadline_at: datetime | None = None
    #: the renderer that draws it (``tessera``: the built-in kernel)
    renderer: str = "tessera"
    #: ``tile_size: "auto"``: the scheduler picks the edge at planning (``tile_size`` 0 until then)
    tile_auto: bool = False
    #: what a pixel-sample's cost depends on (renderer, scene, bounces): the planner measures it
    #: over the finished tiles of earlier jobs with the same key
    cost_key: str | None = None


@dataclass(frozen=True)
class Job:
    """One row of ``jobs``."""

    job_id: str
    idempotency_key: str
    fingerprint: str
    project: str
    request: dict[str, Any]
    scene: dict[str, Any]
    frame: int
    input_hash: str
    width: int
    height: int
    spp: int
    tile_size: int
    tiles_total: int
    state: JobState
    generation: int
    cancel_requested: bool
    result_location: str | None
    result_sha256: str | None
    float_location: str | None
    last_error_code: str | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    priority: int = 50
    deadline_at: datetime | None = None
    renderer: str = "tessera"
    tile_auto: bool = False
    cost_key: str | None = None

    @classmethod
    def from_record(cls, row: Record) -> Job:
        """Build from a ``SELECT * FROM jobs`` row."""
        return _build(cls, row, state=JobState(row["state"]))


@dataclass(frozen=True)
class JobControl:
    """What a worker reads of its job between passes (one indexed read)."""

    state: JobState
    cancel_requested: bool
    deadline_at: datetime | None
    last_error_code: str | None


@dataclass(frozen=True)
class ProjectView:
    """A project as ``project list``/``show`` report it: settings, tiles, recent share."""

    name: str
    #: False for a project with no ``projects`` row (weight 1, no cap: the defaults)
    configured: bool
    weight: float
    max_in_flight: int | None
    #: open tiles of its live jobs nobody holds (queued, failed_retryable)
    queued: int
    #: its tiles being rendered (leased, progressing)
    in_flight: int
    #: kernel core-seconds its tile attempts used within the share window
    core_seconds: float
    #: core_seconds over every project's in the window (0 when nothing ran)
    share: float


@dataclass(frozen=True)
class Project:
    """One row of ``projects``: an operator's settings for a project's fair share."""

    name: str
    weight: float
    max_in_flight: int | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_record(cls, row: Record) -> Project:
        """Build from a ``SELECT * FROM projects`` row."""
        return _build(cls, row)


@dataclass(frozen=True)
class SubmitResult:
    """The job bound to an idempotency key, and whether this submit created it."""

    job: Job
    created: bool


@dataclass(frozen=True)
class Tile:
    """One row of ``tiles``; ``generation`` is that of its last ``TILES`` message."""

    job_id: str
    tile_index: int
    x0: int
    y0: int
    x1: int
    y1: int
    state: TileState
    lease_fence: int
    generation: int
    samples_done: int
    result_key: str | None
    result_sha256: str | None
    attempt_count: int
    last_error_code: str | None
    last_error: str | None
    published_at: datetime | None
    updated_at: datetime

    @property
    def rect(self) -> Rect:
        """The pixel rectangle."""
        return Rect(self.x0, self.y0, self.x1, self.y1)

    @classmethod
    def from_record(cls, row: Record) -> Tile:
        """Build from a ``SELECT * FROM tiles`` row."""
        return _build(cls, row, state=TileState(row["state"]))


class TileResultRef(NamedTuple):
    """Where a tile's committed result is: ``result_key`` names an object, else the result is
    inline (``tile_results``); ``result_sha256`` names the bytes. What the finalizer reads of
    each tile (a full :class:`Tile` takes 11 us to build; an 8x8-tiled 512x512 frame has 4096)."""

    tile_index: int
    rect: Rect
    result_key: str | None
    result_sha256: str | None


@dataclass(frozen=True)
class TileFence:
    """An owner's claim on a tile: write its lease's ``token`` as the tile's fence and record
    the attempt (see :meth:`~shared.metadata.MetadataStore.fence_tile`)."""

    job_id: str
    tile_index: int
    token: int
    attempt_id: str
    node: str
    resumed_from: int = 0


@dataclass(frozen=True)
class FirstFence:
    """What :meth:`~shared.metadata.MetadataStore.fence_first` did: ``fenced``, or nothing
    written; either way the tile row as it was just before (``None``: no such tile)."""

    fenced: bool
    tile: Tile | None


@dataclass(frozen=True)
class TileCommit:
    """An owner's fenced commit of a tile's result, built once and passed down as it is (see
    :meth:`~shared.metadata.MetadataStore.commit_tile`).

    The result is an object (``result_key``) or, for a small one, ``result_data`` stored inline
    with the commit (``result_key`` None): exactly one of the two, or :class:`ValidationError`.
    """

    job_id: str
    tile_index: int
    _: KW_ONLY
    token: int
    attempt_id: str
    result_key: str | None
    result_sha256: str
    samples_done: int
    node: str
    result_data: bytes | None = None
    #: seconds of one core the attempt's passes took (recorded on its attempt row; None: not
    #: measured)
    render_seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.result_key is None) == (self.result_data is None):
            raise ValidationError("commit_tile: give exactly one of result_key and result_data")


@dataclass(frozen=True)
class TileCounts:
    """Progress of one job's tiles (for status replies and progress bars)."""

    total: int
    done: int
    by_state: dict[TileState, int]
    samples_done: int


@dataclass(frozen=True)
class Attempt:
    """One row of ``attempts``: one execution of a tile (or, with no tile, a finalization)."""

    attempt_id: str
    job_id: str
    tile_index: int | None
    kind: str
    node: str
    fence: int
    resumed_from: int
    started_at: datetime
    ended_at: datetime | None
    outcome: AttemptOutcome | None
    error_code: str | None
    error: str | None
    #: seconds of one core its passes took (a done attempt's, from schema 10 on; else None)
    render_seconds: float | None = None

    @classmethod
    def from_record(cls, row: Record) -> Attempt:
        """Build from a ``SELECT * FROM attempts`` row."""
        outcome = row["outcome"]
        return _build(cls, row, outcome=None if outcome is None else AttemptOutcome(outcome))


@dataclass(frozen=True)
class AuditEvent:
    """One row of ``job_events``: a state change of a job or one of its tiles.

    ``from_state``/``to_state`` are :class:`JobState` or :class:`TileState` values (by
    ``entity``); ``from_state`` is ``None`` only for the job's creation.
    """

    id: int
    job_id: str
    tile_index: int | None
    attempt_id: str | None
    node: str
    entity: str
    from_state: str | None
    to_state: str
    trigger: str
    error_code: str | None
    error: str | None
    detail: str | None
    at: datetime

    @classmethod
    def from_record(cls, row: Record) -> AuditEvent:
        """Build from a ``SELECT * FROM job_events`` row."""
        return _build(cls, row)


_D = TypeVar("_D")


def _build(cls: type[_D], row: Record, **override: Any) -> _D:
    """A row model from the row's columns of its field names (``override`` replaces some).

    The instance's ``__dict__`` is filled directly: a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``, 6 of the 11 us a 17-field :class:`Tile` took to
    build, and the planner, the dispatcher and every fence build them by the thousand. So
    only for a model with no ``__post_init__`` (the models built here have none: checked).
    """
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} validates in __post_init__: build it with its __init__")
    obj = object.__new__(cls)
    values = obj.__dict__
    for name in field_names(cls):
        values[name] = row[name]
    values.update(override)
    return obj
