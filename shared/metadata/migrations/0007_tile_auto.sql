-- Tessera metadata store, schema version 7: tile_size "auto". The scheduler picks such a job's
-- tile edge when it plans it (tile_size 0 until then), from the measured cost of the tiles of
-- earlier jobs with the same cost_key (renderer, scene and bounces: what a pixel-sample costs).
ALTER TABLE jobs ADD COLUMN tile_auto boolean NOT NULL DEFAULT false;
ALTER TABLE jobs ADD COLUMN cost_key text;
ALTER TABLE jobs DROP CONSTRAINT jobs_tile_size_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_tile_size_check
    CHECK (tile_size > 0 OR (tile_auto AND tile_size = 0));
-- The newest jobs of one cost key (the planner reads their finished tile attempts).
CREATE INDEX jobs_cost_key ON jobs (cost_key, created_at DESC) WHERE cost_key IS NOT NULL;
-- The newest jobs of one renderer (the fallback when a scene has no measurement yet).
CREATE INDEX jobs_renderer_recent ON jobs (renderer, created_at DESC);
