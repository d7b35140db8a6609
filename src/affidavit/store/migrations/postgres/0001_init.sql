-- Jobs and their hash-chained event logs. A job's chain head is its last event (by the
-- (job_id, version) index), so an append writes event rows only.
CREATE TABLE jobs (
    job_id           TEXT PRIMARY KEY,
    namespace        TEXT NOT NULL,
    status           TEXT NOT NULL,
    plan_name        TEXT,
    idempotency_key  TEXT,
    submitted_by     TEXT,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL,
    attempt_id       TEXT,
    lease_owner      TEXT,
    lease_expires_at DOUBLE PRECISION,
    output           TEXT,
    error            TEXT
);
-- NULL keys are distinct, so jobs without an idempotency key never collide.
CREATE UNIQUE INDEX jobs_idempotency ON jobs (namespace, idempotency_key);
CREATE INDEX jobs_status ON jobs (status, namespace);
CREATE INDEX jobs_created ON jobs (created_at);
CREATE TABLE events (
    job_id      TEXT NOT NULL,
    version     BIGINT NOT NULL,
    event_id    TEXT NOT NULL UNIQUE,
    type        TEXT NOT NULL,
    payload     BYTEA NOT NULL,
    chain_hash  TEXT NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, version)
);
