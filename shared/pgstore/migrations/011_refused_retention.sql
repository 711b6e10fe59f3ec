-- The rows of opens refused for lack of capacity, by when they finished:
-- the reaper deletes those past their retention (reap.Store.PruneRefused),
-- oldest first, a batch per run, and this index finds them without a scan
-- of every session. The predicate is the delete's, so the index holds
-- those rows only. The database is one environment's (005), so there is
-- no environment column to lead with.
CREATE INDEX sessions_refused ON sessions (finished_at, id)
    WHERE status = 'failed' AND end_kind = 'no_capacity' AND end_actor = 'open';
