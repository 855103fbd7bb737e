-- Tessera metadata store, schema version 2: small tile results inline, a cheap "all done?".

-- A tile result of at most TESSERA_INLINE_RESULT_BYTES (a small tile's float accumulator, a few
-- KiB) is committed here, in the same statement as the fenced commit that names its sha256
-- (tiles.result_sha256), instead of as one object-store object per tile. tiles.result_key is
-- NULL for such a tile. Written once per commit; deleted with its tile.
CREATE TABLE tile_results (
    job_id            text        NOT NULL,
    tile_index        integer     NOT NULL,
    sha256            text        NOT NULL,
    data              bytea       NOT NULL,
    PRIMARY KEY (job_id, tile_index),
    FOREIGN KEY (job_id, tile_index) REFERENCES tiles (job_id, tile_index) ON DELETE CASCADE
);
-- Float noise does not compress: store out of line uncompressed when a value is large.
ALTER TABLE tile_results ALTER COLUMN data SET STORAGE EXTERNAL;

-- The finalizer asks "is any tile of this job not done?" on every tile-done event: with this
-- index that is one probe into the job's open tiles instead of a count over all of them.
CREATE INDEX tiles_not_done ON tiles (job_id) WHERE state <> 'done';
