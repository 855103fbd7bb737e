-- Tessera metadata store, schema version 3: dispatch from PostgreSQL (priorities, fair share
-- between projects, lossless pause, deadlines) and renderers other than the built-in kernel.

-- A job's priority (0..100, higher first), its deadline (NULL: none), and the renderer that
-- draws it ('tessera' is the built-in numba kernel). 'paused' is a new job state.
ALTER TABLE jobs ADD COLUMN priority    integer     NOT NULL DEFAULT 50
    CHECK (priority BETWEEN 0 AND 100);
ALTER TABLE jobs ADD COLUMN deadline_at timestamptz;
ALTER TABLE jobs ADD COLUMN renderer    text        NOT NULL DEFAULT 'tessera';
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN (
    'queued', 'running', 'progressing', 'paused', 'finalizing', 'completed',
    'failed_retryable', 'failed_terminal', 'dead_lettered', 'cancelled'));
-- Deadlines are checked over the live jobs that have one.
CREATE INDEX jobs_deadline ON jobs (deadline_at)
    WHERE deadline_at IS NOT NULL
      AND state NOT IN ('completed', 'failed_terminal', 'dead_lettered', 'cancelled');

-- A tile is *released* once the scheduler has published it to TILES (published_at set); the
-- dispatcher picks the next ones among the unreleased queued tiles of live jobs.
CREATE INDEX tiles_unreleased ON tiles (job_id, tile_index)
    WHERE published_at IS NULL AND state = 'queued';

-- Projects an operator has configured: weight of its fair share, cap on its leased tiles.
-- A project with no row has weight 1 and no cap.
CREATE TABLE projects (
    name              text        PRIMARY KEY,
    weight            double precision NOT NULL CHECK (weight > 0),
    max_in_flight     integer     CHECK (max_in_flight > 0),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- The audit trail of project settings: one row per change, with who made it.
CREATE TABLE project_events (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project           text        NOT NULL,
    weight            double precision NOT NULL,
    max_in_flight     integer,
    actor             text        NOT NULL DEFAULT '',
    at                timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX project_events_project ON project_events (project, id);
