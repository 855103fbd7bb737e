"""The worker's pool plans each prepared statement once (``generic_plans``, StoreBase.connect).

Under PostgreSQL's default ``plan_cache_mode`` (``auto``) a statement whose parameters are
arrays is planned again at every call: the generic plan assumes several elements per array
and loses to the custom plan of the one job asked about. ``pg_prepared_statements`` counts,
per statement of the session, its executions on a custom plan (each planned for that call) and
on the generic one (planned once): with one connection in the pool, that session is the
store's.
"""

from __future__ import annotations

import pytest

from shared.metadata import MetadataStore
from tests.metadata.test_fastpath import Factory, _job

CALLS = 8


async def _plans(db: MetadataStore) -> tuple[int, int]:
    """(custom, generic) plans the completion question ran on, on the pool's connection."""
    row = await db._read(
        "plans",
        lambda c: c.fetchrow(
            "SELECT coalesce(sum(custom_plans), 0)::int AS custom, "
            "coalesce(sum(generic_plans), 0)::int AS generic FROM pg_prepared_statements "
            "WHERE statement LIKE '%tiles_total > 0 AND NOT EXISTS%' "
            "AND statement NOT LIKE '%pg_prepared_statements%'"  # (this query's own text)
        ),
    )
    assert row is not None
    return int(row["custom"]), int(row["generic"])


@pytest.mark.parametrize("generic", [False, True], ids=["auto", "generic"])
async def test_the_completion_question_is_planned_once_with_generic_plans(
    database_url: str, new_job: Factory, generic: bool
) -> None:
    db = await MetadataStore.connect(database_url, min_size=1, max_size=1, generic_plans=generic)
    try:
        mode = await db._read("mode", lambda c: c.fetchval("SHOW plan_cache_mode"))
        assert mode == ("force_generic_plan" if generic else "auto")
        job_id = await _job(db, new_job)
        for _ in range(CALLS):
            assert await db.completed_by(job_id) is None  # planned, no tile done
        custom, made = await _plans(db)
        if generic:
            assert (custom, made) == (0, CALLS)  # planned once, run 8 times
        else:
            assert (custom, made) == (CALLS, 0)  # what the setting saves: a plan per call
    finally:
        await db.close()
