-- Tessera metadata store, schema version 1.
-- Applied once, inside one transaction, under the migration advisory lock (see migrate.py).
-- Never edit an applied migration: add 0002_*.sql. The state lists below mirror
-- shared.lifecycle.JobState / TileState (tests/metadata/test_schema.py checks they agree).

CREATE TABLE jobs (
    job_id            text        PRIMARY KEY,
    idempotency_key   text        NOT NULL UNIQUE,
    fingerprint       text        NOT NULL,
    project           text        NOT NULL DEFAULT '',
    request           jsonb       NOT NULL,
    scene             jsonb       NOT NULL,
    frame             integer     NOT NULL DEFAULT 0,
    input_hash        text        NOT NULL,
    width             integer     NOT NULL CHECK (width > 0),
    height            integer     NOT NULL CHECK (height > 0),
    spp               integer     NOT NULL CHECK (spp > 0),
    tile_size         integer     NOT NULL CHECK (tile_size > 0),
    tiles_total       integer     NOT NULL DEFAULT 0 CHECK (tiles_total >= 0),
    state             text        NOT NULL DEFAULT 'queued' CHECK (state IN (
        'queued', 'running', 'progressing', 'finalizing', 'completed',
        'failed_retryable', 'failed_terminal', 'dead_lettered', 'cancelled')),
    generation        integer     NOT NULL DEFAULT 0,
    cancel_requested  boolean     NOT NULL DEFAULT false,
    result_location   text,
    result_sha256     text,
    float_location    text,
    last_error_code   text,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz
);
-- list_jobs pages newest-first by job_id (UUIDv7, time-ordered) within a state.
CREATE INDEX jobs_state_job_id ON jobs (state, job_id);

CREATE TABLE tiles (
    job_id            text        NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    tile_index        integer     NOT NULL CHECK (tile_index >= 0),
    x0                integer     NOT NULL,
    y0                integer     NOT NULL,
    x1                integer     NOT NULL,
    y1                integer     NOT NULL,
    state             text        NOT NULL DEFAULT 'queued' CHECK (state IN (
        'queued', 'leased', 'progressing', 'done',
        'failed_retryable', 'failed_terminal', 'dead_lettered', 'cancelled')),
    lease_fence       bigint      NOT NULL DEFAULT 0,
    generation        integer     NOT NULL DEFAULT 0,
    samples_done      integer     NOT NULL DEFAULT 0,
    result_key        text,
    result_sha256     text,
    attempt_count     integer     NOT NULL DEFAULT 0,
    last_error_code   text,
    last_error        text,
    published_at      timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, tile_index),
    CHECK (x0 >= 0 AND y0 >= 0 AND x1 > x0 AND y1 > y0)
);
-- The sweeper scans open tiles by last publish time.
CREATE INDEX tiles_open_published ON tiles (published_at)
    WHERE state NOT IN ('done', 'failed_terminal', 'dead_lettered', 'cancelled');

CREATE TABLE attempts (
    attempt_id        text        PRIMARY KEY,
    job_id            text        NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    tile_index        integer,
    kind              text        NOT NULL CHECK (kind IN ('tile', 'final')),
    node              text        NOT NULL DEFAULT '',
    fence             bigint      NOT NULL DEFAULT 0,
    resumed_from      integer     NOT NULL DEFAULT 0,
    started_at        timestamptz NOT NULL DEFAULT now(),
    ended_at          timestamptz,
    outcome           text        CHECK (outcome IN (
        'done', 'retryable', 'terminal', 'lease_lost', 'handed_back', 'cancelled', 'fenced')),
    error_code        text,
    error             text,
    -- A NULL tile_index (a finalization attempt) is not checked against tiles (MATCH SIMPLE).
    FOREIGN KEY (job_id, tile_index) REFERENCES tiles (job_id, tile_index) ON DELETE CASCADE,
    CHECK ((kind = 'tile') = (tile_index IS NOT NULL))
);
CREATE INDEX attempts_job ON attempts (job_id, started_at);

CREATE TABLE job_events (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id            text        NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    tile_index        integer,
    attempt_id        text,
    node              text        NOT NULL DEFAULT '',
    entity            text        NOT NULL CHECK (entity IN ('job', 'tile')),
    from_state        text,
    to_state          text        NOT NULL,
    trigger           text        NOT NULL,
    error_code        text,
    error             text,
    detail            text,
    at                timestamptz NOT NULL DEFAULT now(),
    CHECK ((entity = 'tile') = (tile_index IS NOT NULL))
);
CREATE INDEX job_events_job ON job_events (job_id, id);
