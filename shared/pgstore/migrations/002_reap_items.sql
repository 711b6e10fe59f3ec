-- What each reaper run handled (or, in a dry run, would have): kind,
-- session and objects, so an operator can see exactly what a dry run would
-- delete before turning it off.
ALTER TABLE reap_runs ADD COLUMN items jsonb NOT NULL DEFAULT '[]';
