-- Tessera metadata store, schema version 6: the console's farm numbers.
-- The farm verb counts the finalization attempts that ended within its window (failures,
-- lost leases): found by this index, not by a scan of every attempt (tile attempts have
-- attempts_ended).
CREATE INDEX attempts_final_ended ON attempts (ended_at) WHERE kind = 'final';
