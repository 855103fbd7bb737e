-- Tessera metadata store, schema version 5: lossless pause. An attempt stopped by its job's
-- pause (checkpoint written, tile handed back unreleased) ends 'paused'.
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN (
    'done', 'retryable', 'terminal', 'lease_lost', 'handed_back', 'cancelled', 'fenced',
    'paused'));
-- A project's core-second share sums its tile attempts that ended within the share window or
-- are still open: found by this index, not by a scan of every attempt ever made.
CREATE INDEX attempts_recent ON attempts (ended_at) WHERE kind = 'tile';
