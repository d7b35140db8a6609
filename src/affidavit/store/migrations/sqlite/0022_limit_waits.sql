-- older schema readable
-- The calls waiting for a limit's grant now (affidavit.Limit): what `jobs show` and the trace
-- show as "waiting for limit NAME". A waiting call records nothing in its job's log; its row
-- here is written when it starts waiting (outside any T1) and deleted in the transaction that
-- takes its grant, or when its run stops waiting. A row whose claim no longer holds its job (the
-- worker died waiting) is not shown, and goes with the job's next grant of the limit.
CREATE TABLE limit_waits (
    grant_id   TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    job_id     TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    since      TEXT NOT NULL,
    reason     TEXT NOT NULL
);
CREATE INDEX limit_waits_job ON limit_waits (job_id);
