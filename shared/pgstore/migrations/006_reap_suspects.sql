-- What reaper runs saw wrong with running sessions and have not confirmed
-- yet (reap.Suspect): a VMI or workspace Pod missing, a VM or Pod down,
-- since the first look that saw it. Each run replaces the whole set with
-- what it saw, so a node back between two looks clears its suspect and a
-- session that ended leaves nothing behind.
CREATE TABLE reap_suspects (
    session_id text NOT NULL,
    object     text NOT NULL,
    trouble    text NOT NULL CHECK (trouble IN ('missing', 'down')),
    detail     text NOT NULL DEFAULT '',
    since      timestamptz NOT NULL,
    PRIMARY KEY (session_id, object, trouble)
);
