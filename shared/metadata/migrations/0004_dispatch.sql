-- Tessera metadata store, schema version 4: what the dispatcher reads every round.

-- Fair share measures each project's kernel core-seconds over a sliding window from its
-- attempts: those that ended inside the window, and those still open.
CREATE INDEX attempts_ended ON attempts (ended_at) WHERE kind = 'tile';
CREATE INDEX attempts_open ON attempts (job_id, tile_index) WHERE ended_at IS NULL;
