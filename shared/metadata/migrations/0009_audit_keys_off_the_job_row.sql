-- Tessera metadata store, schema version 9: a tile's attempt and audit rows reference its tile
-- row, not its job's row. Every such row is written in the transaction that updates (so already
-- locks) the tile row, so its foreign-key check costs nothing; a check against the job's row
-- locks that one row FOR KEY SHARE from every concurrent fence and commit of the job's tiles,
-- and concurrent share locks on one row make PostgreSQL create a new MultiXact per locker
-- (bench (b), one worker: the fence statement 0.67 -> 0.10 ms and PostgreSQL 0.9 -> 0.5
-- core-ms per tile). Integrity is the same: a tile row references its job, and a job-level
-- row (no tile) still references the job directly, through a column that is the job id only
-- for such rows (NULL, so not checked, for a tile's). Deleting a job still deletes them all.
-- Rewrites attempts and job_events (adds a stored column): a long lock on a large store.
ALTER TABLE attempts DROP CONSTRAINT attempts_job_id_fkey;
ALTER TABLE attempts ADD COLUMN final_of text
    GENERATED ALWAYS AS (CASE WHEN tile_index IS NULL THEN job_id END) STORED
    REFERENCES jobs (job_id) ON DELETE CASCADE;
CREATE INDEX attempts_final_of ON attempts (final_of) WHERE final_of IS NOT NULL;

ALTER TABLE job_events DROP CONSTRAINT job_events_job_id_fkey;
ALTER TABLE job_events ADD COLUMN job_of text
    GENERATED ALWAYS AS (CASE WHEN tile_index IS NULL THEN job_id END) STORED
    REFERENCES jobs (job_id) ON DELETE CASCADE;
CREATE INDEX job_events_job_of ON job_events (job_of) WHERE job_of IS NOT NULL;
ALTER TABLE job_events ADD CONSTRAINT job_events_tile_fkey
    FOREIGN KEY (job_id, tile_index) REFERENCES tiles (job_id, tile_index) ON DELETE CASCADE;
