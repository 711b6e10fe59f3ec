-- The waitlist: students who asked to wait for capacity (openSession with
-- "wait": true), served first come, first served. seq is the arrival
-- order, given by the database; id becomes the session's id when the
-- entry is turned into a provisioning session (in one transaction, under
-- the capacity lock). polled_at is the entry's last sign of life: an entry
-- nobody polls is dropped.
CREATE TABLE waitlist (
    id          uuid PRIMARY KEY,
    seq         bigserial NOT NULL UNIQUE,
    student     text NOT NULL UNIQUE CHECK (student <> ''),
    lab         text NOT NULL CHECK (lab <> ''),
    student_key text NOT NULL CHECK (student_key <> ''),
    enqueued_at timestamptz NOT NULL,
    polled_at   timestamptz NOT NULL
);
