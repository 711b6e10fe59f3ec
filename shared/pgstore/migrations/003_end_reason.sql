-- Why and by whom a session ended, typed: end_kind decides what a student
-- is shown, end_actor who ended it; failure_reason keeps the detail for
-- administrators. Rows ended before these columns existed are classified
-- once, here, from the text they were recorded with.
ALTER TABLE sessions
    ADD COLUMN end_kind  text NOT NULL DEFAULT ''
        CHECK (end_kind IN ('', 'closed', 'expired', 'ghost', 'no_capacity', 'provisioning_failed')),
    ADD COLUMN end_actor text NOT NULL DEFAULT ''
        CHECK (end_actor IN ('', 'student', 'admin', 'reaper', 'open'));

UPDATE sessions SET
    end_kind = CASE
        WHEN status = 'closed' THEN 'closed'
        WHEN status = 'expired' THEN 'expired'
        WHEN failure_reason LIKE 'no_capacity%' THEN 'no_capacity'
        WHEN failure_reason LIKE 'provisioning_failed%' THEN 'provisioning_failed'
        ELSE 'ghost' END,
    end_actor = CASE
        WHEN failure_reason LIKE 'closed by admin%' OR failure_reason LIKE '%; closed by admin%' THEN 'admin'
        WHEN failure_reason LIKE 'closed by student%' OR failure_reason LIKE '%; closed by student%' THEN 'student'
        WHEN failure_reason LIKE 'no_capacity%' OR failure_reason LIKE 'provisioning_failed%'
            OR failure_reason LIKE '%reclaimed when the student opened%' THEN 'open'
        ELSE 'reaper' END
WHERE status NOT IN ('provisioning', 'running');

-- A final row always says why it ended; a live one never does.
ALTER TABLE sessions ADD CHECK ((status IN ('provisioning', 'running')) = (end_kind = ''));
