-- The warm pool: a pool instance is an ordinary session row, so every rule
-- (capacity counting, the reaper's inventory, ghosts, orphans, the one
-- delete order) applies to it unchanged. pool says which rows are pool
-- instances: 'idle' for an unclaimed one (its student is the reserved
-- pool student, see seating.PoolStudent), 'claimed' for a session that
-- came from the pool, '' for every other session. claimed_for is the id
-- the student knew before the claim (their open's row, or their waitlist
-- entry), so a poll or close with that id finds the claimed session.
ALTER TABLE sessions
    ADD COLUMN pool        text NOT NULL DEFAULT '' CHECK (pool IN ('', 'idle', 'claimed')),
    ADD COLUMN claimed_for uuid UNIQUE;

-- Unclaimed instances share the pool student: only students' live rows
-- are one per student.
DROP INDEX sessions_one_live_per_student;
CREATE UNIQUE INDEX sessions_one_live_per_student ON sessions (student)
    WHERE status IN ('provisioning', 'running') AND pool <> 'idle';

CREATE INDEX sessions_pool_idle ON sessions (lab, started_at) WHERE pool = 'idle' AND status IN ('provisioning', 'running');
