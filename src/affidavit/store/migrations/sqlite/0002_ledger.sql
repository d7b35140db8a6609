-- The tool-invocation ledger: one row per (job, idempotency key). Only one attempt can insert
-- it; a committed row is never executed again.
CREATE TABLE tool_invocations (
    job_id          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    node_id         TEXT NOT NULL,
    step_id         TEXT NOT NULL,
    tool_name       TEXT NOT NULL,
    args_hash       TEXT NOT NULL,
    status          TEXT NOT NULL,
    invocation_id   TEXT NOT NULL,
    attempt_id      TEXT,
    tries           INTEGER NOT NULL,
    result          TEXT,
    error           TEXT,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    PRIMARY KEY (job_id, idempotency_key)
) WITHOUT ROWID;  -- small rows: clustered on the key, one B-tree page per write, not two
CREATE INDEX jobs_runnable ON jobs (status, lease_expires_at);
