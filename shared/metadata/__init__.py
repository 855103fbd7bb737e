"""The metadata store: PostgreSQL (asyncpg pool) as Tessera's source of truth.

Tables (``migrations/0001_initial.sql``): ``jobs`` (one row per idempotency key), ``tiles``
(``(job_id, tile_index)``, with the lease fence), ``attempts`` (one execution of a tile or a
finalization), ``job_events`` (the audit trail) and ``schema_migrations``.

Rules the code keeps:

- every state change is ``UPDATE ... WHERE state = $current`` with the new state from
  :mod:`shared.core.lifecycle`, and its ``job_events`` row is written in the same transaction;
- an owner's writes are fenced: the lease's acquire revision is written with
  ``lease_fence < $token`` and every later write requires ``lease_fence = $token``;
- asyncpg and socket errors never leave this package: they become
  :class:`~shared.core.errors.StoreUnavailable` (retryable) or :class:`MetadataError` (terminal),
  see :mod:`shared.metadata.translate`.
"""

from shared.metadata.models import (
    SUBMIT_TRIGGER,
    Attempt,
    AttemptOutcome,
    AuditEvent,
    CommitOutcome,
    FirstFence,
    Job,
    JobControl,
    NewJob,
    Project,
    ProjectView,
    SubmitResult,
    Tile,
    TileCommit,
    TileCounts,
    TileFence,
    TileResultRef,
)
from shared.metadata.store import MetadataStore
from shared.metadata.translate import MetadataError

__all__ = [
    "SUBMIT_TRIGGER",
    "Attempt",
    "AttemptOutcome",
    "AuditEvent",
    "CommitOutcome",
    "FirstFence",
    "Job",
    "JobControl",
    "MetadataError",
    "MetadataStore",
    "NewJob",
    "Project",
    "ProjectView",
    "SubmitResult",
    "Tile",
    "TileCommit",
    "TileCounts",
    "TileFence",
    "TileResultRef",
]
