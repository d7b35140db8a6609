-- older schema readable
-- Schedules. Each row fires jobs at its slots: a cron expression read in its time zone, or a
-- period in whole seconds (`every_seconds`, slots aligned to the Unix epoch). A slot's job has
-- the idempotency key `schedule:NAME:SLOT` (the slot in ISO 8601 UTC), so the jobs index makes
-- a second job for one slot impossible whatever the schedulers do; `last_slot` (Unix seconds)
-- only saves them the look-up. `anchor`: slots at or before it are never due (the schedule's
-- creation, or its last resume). `scheduler_state` holds the one lease under which a worker
-- runs the scheduler. Only writers use the tables, so a store opened read-only reads the
-- schema before it.
CREATE TABLE schedules (
    name          TEXT PRIMARY KEY,
    cron          TEXT,
    every_seconds BIGINT,
    timezone      TEXT NOT NULL,
    target_kind   TEXT NOT NULL CHECK (target_kind IN ('agent', 'plan')),
    target        TEXT NOT NULL,
    plan_text     TEXT,
    tools         TEXT NOT NULL,
    input         TEXT NOT NULL,
    queue         TEXT,
    catch_up      TEXT NOT NULL CHECK (catch_up IN ('none', 'latest', 'all')),
    namespace     TEXT NOT NULL,
    paused        INTEGER NOT NULL DEFAULT 0,
    created_at    TEXT NOT NULL,
    anchor        BIGINT NOT NULL,
    last_slot     BIGINT,
    skipped       INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);
CREATE TABLE scheduler_state (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    lease_owner TEXT,
    lease_until DOUBLE PRECISION
);
INSERT INTO scheduler_state (id, lease_owner, lease_until) VALUES (1, NULL, NULL);
