-- Tessera metadata store, schema version 8: one index on tile attempts' end time, not two.
-- attempts_recent (version 5) is attempts_ended (version 4) again, column for column and with the
-- same predicate: every attempt insert and every end of an attempt updated both.
DROP INDEX IF EXISTS attempts_recent;
