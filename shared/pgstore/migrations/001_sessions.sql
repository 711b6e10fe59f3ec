-- One row per lab session. The row is the source of truth for who has which
-- session; cluster objects are named after id.
CREATE TABLE sessions (
    id             uuid PRIMARY KEY,
    student        text NOT NULL CHECK (student <> ''),
    lab            text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('vm', 'pod')),
    status         text NOT NULL CHECK (status IN ('provisioning', 'running', 'expired', 'failed', 'closed')),
    started_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    max_expires_at timestamptz NOT NULL,
    ready_at       timestamptz,
    finished_at    timestamptz,
    nodes          jsonb NOT NULL DEFAULT '[]',
    failure_reason text NOT NULL DEFAULT '',
    grading_token  text NOT NULL,
    CHECK (expires_at <= max_expires_at),
    CHECK ((status IN ('provisioning', 'running')) = (finished_at IS NULL))
);

-- At most one live session per student, enforced by the database so two
-- concurrent opens by one student yield one session.
CREATE UNIQUE INDEX sessions_one_live_per_student ON sessions (student)
    WHERE status IN ('provisioning', 'running');

CREATE INDEX sessions_by_student ON sessions (student, started_at DESC);
CREATE INDEX sessions_live ON sessions (started_at) WHERE status IN ('provisioning', 'running');

-- One row per reaper run (issue 4): what it did and what failed.
CREATE TABLE reap_runs (
    id          bigserial PRIMARY KEY,
    trigger     text NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    dry_run     boolean NOT NULL DEFAULT false,
    counts      jsonb NOT NULL DEFAULT '{}',
    failures    jsonb NOT NULL DEFAULT '[]'
);
CREATE INDEX reap_runs_recent ON reap_runs (started_at DESC);
