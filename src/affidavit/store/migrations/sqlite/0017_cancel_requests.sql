-- older schema readable
-- Cancel requests. `affidavit cancel` on a job whose tool call is in flight records a request
-- here instead of cutting the call off: the call finishes and its outcome is recorded as if
-- no cancel had come, then the job ends cancelled. The triggers make the request hold at the
-- next step boundary whatever the worker knows: once a job has a request, no new invocation
-- starts (a ledger row inserted as started, or moved back to started for a new try) and the
-- job neither completes nor waits; the write is refused (the run ends the job cancelled
-- instead). An insert that meets the key's existing row is not refused: it starts nothing, and
-- the in-flight invocation it finds is resolved as after any crash. Only writers use the
-- table, so a store opened read-only reads the schema before it.
CREATE TABLE cancel_requests (
    job_id       TEXT PRIMARY KEY,
    requested_at TEXT NOT NULL,
    reason       TEXT,
    requested_by TEXT
);
CREATE TRIGGER tool_invocations_cancel_insert BEFORE INSERT ON tool_invocations
WHEN NEW.status = 'started'
    AND EXISTS (SELECT 1 FROM cancel_requests c WHERE c.job_id = NEW.job_id)
    AND NOT EXISTS (
        SELECT 1 FROM tool_invocations t
        WHERE t.job_id = NEW.job_id AND t.idempotency_key = NEW.idempotency_key
    )
BEGIN
    SELECT RAISE(ABORT, 'affidavit_cancel_requested');
END;
CREATE TRIGGER tool_invocations_cancel_restart BEFORE UPDATE OF status ON tool_invocations
WHEN NEW.status = 'started' AND OLD.status <> 'started'
    AND EXISTS (SELECT 1 FROM cancel_requests c WHERE c.job_id = NEW.job_id)
BEGIN
    SELECT RAISE(ABORT, 'affidavit_cancel_requested');
END;
CREATE TRIGGER jobs_cancel_requested BEFORE UPDATE OF status ON jobs
WHEN NEW.status IN ('completed', 'waiting') AND OLD.status <> NEW.status
    AND EXISTS (SELECT 1 FROM cancel_requests c WHERE c.job_id = NEW.job_id)
BEGIN
    SELECT RAISE(ABORT, 'affidavit_cancel_requested');
END;
