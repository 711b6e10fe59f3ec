-- The environment (LABKEEP_ENV) this database belongs to: one row, written
-- by the first labkeep that migrates the database and compared by every
-- later one (pgstore.Open), so a deployment pointed at another
-- environment's database by mistake refuses to start instead of reaping
-- that environment's sessions as its own ghosts.
CREATE TABLE environment (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    env        text NOT NULL CHECK (env <> ''),
    claimed_at timestamptz NOT NULL DEFAULT now()
);
