"""Row models built from real rows without their ``__init__`` (``_build``): the same values as
built through it, and a model that validates in ``__post_init__`` is refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from shared.core.fields import field_names
from shared.core.lifecycle import JobState, TileState
from shared.metadata import (
    Attempt,
    AttemptOutcome,
    AuditEvent,
    Job,
    MetadataStore,
    NewJob,
    Project,
    Tile,
    TileCommit,
)
from shared.metadata.models import _build
from tests.metadata.conftest import RECTS

#: the columns each model holds as an enum
_ENUMS: dict[type[Any], dict[str, Callable[[Any], Any]]] = {
    Job: {"state": JobState},
    Tile: {"state": TileState},
    Attempt: {"outcome": lambda v: None if v is None else AttemptOutcome(v)},
}


async def test_models_built_from_rows_equal_their_init(
    store: MetadataStore, new_job: Callable[..., NewJob], database_url: str
) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    await store.plan_tiles(job_id, RECTS, node="sched")
    await store.set_project("demo", weight=2.0, max_in_flight=4)
    assert await store.fence_tile(job_id, 0, token=5, attempt_id="a0", node="w1")
    conn = await asyncpg.connect(database_url)
    try:
        tables: list[tuple[type[Any], str]] = [
            (Job, "jobs"), (Tile, "tiles"), (Attempt, "attempts"), (AuditEvent, "job_events"),
            (Project, "projects"),
        ]  # fmt: skip
        for model, table in tables:
            rows = await conn.fetch(f"SELECT * FROM {table}")
            assert rows, table
            for row in rows:
                built = model.from_record(row)
                values = {name: row[name] for name in field_names(model)}
                for name, convert in _ENUMS.get(model, {}).items():
                    values[name] = convert(values[name])
                expected = model(**values)
                assert built == expected and repr(built) == repr(expected), table
                assert hash(built) == hash(expected)
                assert dataclasses.asdict(built) == dataclasses.asdict(expected)
                with pytest.raises(dataclasses.FrozenInstanceError):
                    built.created_at = None
    finally:
        await conn.close()


def test_a_model_that_validates_is_not_built_around_its_init() -> None:
    with pytest.raises(TypeError, match="__post_init__"):
        _build(TileCommit, {})  # type: ignore[arg-type]
