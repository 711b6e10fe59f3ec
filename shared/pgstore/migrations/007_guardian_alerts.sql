-- The alerts a session's guardian posted to labkeep (alerts.Alert), kept
-- with the session for the admin console. labkeep keeps the newest
-- alerts.Limits.PerSession of a session and bounds every text before it
-- gets here; the checks below hold the same bounds' outer limits in case
-- another writer forgets.
CREATE TABLE guardian_alerts (
    id         bigserial PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    kind       text NOT NULL CHECK (kind <> '' AND length(kind) <= 64),
    subject    text NOT NULL CHECK (octet_length(subject) <= 65536),
    severity   text NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
    message    text NOT NULL CHECK (octet_length(message) <= 65536),
    fields     jsonb NOT NULL DEFAULT '{}',
    workspace  text NOT NULL DEFAULT '',
    first_at   timestamptz NOT NULL,
    last_at    timestamptz NOT NULL,
    count      integer NOT NULL CHECK (count >= 1),
    received   timestamptz NOT NULL
);

CREATE INDEX guardian_alerts_by_session ON guardian_alerts (session_id, id DESC);
