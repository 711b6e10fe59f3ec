-- The public halves of a session's SSH credentials: the key the student
-- logs in with and the session's own host key (for known_hosts). Private
-- keys are never stored here: the student's generated one is handed out
-- once, the host key lives only in the node's Secret.
ALTER TABLE sessions
    ADD COLUMN student_key text NOT NULL DEFAULT '',
    ADD COLUMN host_key    text NOT NULL DEFAULT '';
