"""The worker's pool plans each prepared statement once (``generic_plans``, StoreBase.connect).

Under PostgreSQL's default ``plan_cache_mode`` (``auto``) a statement whose parameters are
arrays is planned again at every call: the generic plan assumes several elements per array
and loses to the custom plan of the one job asked about. ``pg_prepared_statements`` counts,
per statement of the session, its executions on a custom plan (each planned for that call) and
on the generic one (planned once): with one connection in the pool, that session is the
store's.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.tiles import plan_rects
from shared.metadata import MetadataStore, fastpath
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


@pytest.mark.parametrize("tiles", [4, 4096], ids=["planned-on-a-small-table", "on-a-job's"])
async def test_the_fence_reads_and_updates_its_tiles_by_key_on_any_statistics(
    database_url: str, new_job: Factory, tiles: int
) -> None:
    """The fence is planned once per connection, on the statistics of that moment. Planned
    while ``tiles`` was small (the first job's fences), it scanned the table — or, going from
    the arguments to the job first, every tile of the job — for each batch: 35-45 ms a batch
    of a 4096-tile job in bench (b). Its plan now looks each tile up by both key columns and
    updates the row version it read, on small statistics or a job's."""
    db = await MetadataStore.connect(database_url, min_size=1, max_size=1, generic_plans=True)
    try:
        side = 8 * int(tiles**0.5)
        job_id = (await db.submit_job(new_job(width=side, height=side, tile_size=8))).job.job_id
        await db.plan_tiles(job_id, plan_rects(side, side, 8))
        await db._read(
            "delete", lambda c: c.execute("DELETE FROM tiles WHERE job_id <> $1", job_id)
        )
        await db._read("analyze", lambda c: c.execute("ANALYZE tiles; ANALYZE jobs"))
        types = "text[], int[], bigint[], text[], text[], int[], int[], text[], text[], text[], "
        types += "text, text, text, int"
        values = (
            f"ARRAY['{job_id}', '{job_id}'], ARRAY[0, 1], ARRAY[5, 6]::bigint[], "
            "ARRAY['a0', 'a1'], ARRAY['n', 'n'], ARRAY[0, 0], ARRAY[1, 1], ARRAY['queued'], "
            "ARRAY['leased'], ARRAY['queued', 'running'], 'lease', NULL, NULL, 0"
        )

        async def explain(c: Any) -> str:
            await c.execute(f"PREPARE fence_plan({types}) AS {fastpath._LEASE}")
            try:
                rows = await c.fetch(f"EXPLAIN EXECUTE fence_plan({values})")
            finally:
                await c.execute("DEALLOCATE fence_plan")
            return "\n".join(r[0] for r in rows)

        plan = await db._read("explain", explain)
        assert "Seq Scan on tiles" not in plan, plan
        assert "Tid Scan on tiles" in plan, plan  # the update: the version the lookup read
        conds = [
            line for line in plan.splitlines() if "Index Cond" in line and "tile_index" in line
        ]
        assert conds and all("job_id = " in c for c in conds), plan  # both key columns
        scans = [line for line in plan.splitlines() if "Scan using tiles_pkey" in line]
        assert len(scans) == len(conds), plan  # no tiles_pkey scan on the job alone
    finally:
        await db.close()
