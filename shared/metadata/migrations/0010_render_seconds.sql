-- Tessera metadata store, schema version 10: what a tile attempt's passes took on the renderer's
-- threads or processes (seconds of one core, summed over its passes; NULL before this version and
-- for attempts that did not end done). A worker holds twice as many tiles as it has kernel
-- threads and their passes share the threads, so an attempt's fence-to-commit time is about
-- twice its render time: the cost of a pixel-sample (`tile_size: "auto"`) is measured on this
-- column when it is set. Nullable with no default: adding it rewrites no row.
ALTER TABLE attempts ADD COLUMN render_seconds double precision
    CHECK (render_seconds IS NULL OR render_seconds >= 0);
