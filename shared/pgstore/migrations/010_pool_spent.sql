-- A spent warm-pool instance: a claim has started on it, marked and
-- committed before any key is written to it, so it may hold a student's
-- key. It is never claimed again; unless that claim completes ('claimed')
-- it is ended. Like an idle row it belongs to the reserved pool student,
-- so the one-live-session-per-student rule exempts it too.
ALTER TABLE sessions DROP CONSTRAINT sessions_pool_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_pool_check CHECK (pool IN ('', 'idle', 'spent', 'claimed'));

DROP INDEX sessions_one_live_per_student;
CREATE UNIQUE INDEX sessions_one_live_per_student ON sessions (student)
    WHERE status IN ('provisioning', 'running') AND pool NOT IN ('idle', 'spent');
