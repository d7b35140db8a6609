-- older schema readable
-- Cancel requests. `affidavit cancel` on a job whose tool call is in flight records a request
-- here instead of cutting the call off: the call finishes and its outcome is recorded as if
-- no cancel had come, then the job ends cancelled. The triggers make the request hold at the
-- next step boundary whatever the worker knows: once a job has a request, no new invocation
-- starts (a ledger row inserted as started, or moved back to started for a new try) and the
-- job neither completes nor waits; the write is refused with AFJ05 (the run ends the job
-- cancelled instead). An insert that meets the key's existing row is not refused: it starts
-- nothing, and the in-flight invocation it finds is resolved as after any crash. A new
-- invocation first locks the job's row (a statement of its own, so under READ COMMITTED the
-- request check after it sees what a cancel holding that lock committed): a cancel and a new
-- invocation are serialized. Only writers use the table, so a store opened read-only reads the
-- schema before it.
CREATE TABLE cancel_requests (
    job_id       TEXT PRIMARY KEY,
    requested_at TEXT NOT NULL,
    reason       TEXT,
    requested_by TEXT
);
CREATE OR REPLACE FUNCTION affidavit_cancel_requested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'tool_invocations' THEN
        IF TG_OP = 'INSERT' AND EXISTS (
            SELECT 1 FROM tool_invocations t
            WHERE t.job_id = NEW.job_id AND t.idempotency_key = NEW.idempotency_key
        ) THEN
            RETURN NEW;
        END IF;
        PERFORM 1 FROM jobs WHERE job_id = NEW.job_id FOR UPDATE;
    END IF;
    IF EXISTS (SELECT 1 FROM cancel_requests c WHERE c.job_id = NEW.job_id) THEN
        RAISE EXCEPTION 'job %: a cancel was requested; nothing new starts', NEW.job_id
            USING ERRCODE = 'AFJ05', DETAIL = json_build_object('job_id', NEW.job_id)::text;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER tool_invocations_cancel_insert BEFORE INSERT ON tool_invocations
    FOR EACH ROW WHEN (NEW.status = 'started') EXECUTE FUNCTION affidavit_cancel_requested();
CREATE TRIGGER tool_invocations_cancel_restart BEFORE UPDATE OF status ON tool_invocations
    FOR EACH ROW WHEN (NEW.status = 'started' AND OLD.status <> 'started')
    EXECUTE FUNCTION affidavit_cancel_requested();
CREATE TRIGGER jobs_cancel_requested BEFORE UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.status IN ('completed', 'waiting') AND OLD.status <> NEW.status)
    EXECUTE FUNCTION affidavit_cancel_requested();
