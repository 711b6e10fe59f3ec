-- The student's home a session holds (session.Session.Home; '' for a lab
-- that keeps none). A home is in use while a live session holds it, and
-- its last use is when the last session holding it finished: the reaper
-- deletes a home unused for its retention (reap.Store.HomeUse), and this
-- index answers it for the homes of one run without a scan of every
-- session. The database is one environment's (005).
ALTER TABLE sessions ADD COLUMN home text NOT NULL DEFAULT '';
CREATE INDEX sessions_by_home ON sessions (home, finished_at) WHERE home <> '';
