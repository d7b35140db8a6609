-- older schema readable
-- Tags and retention. `job_tags`: each job's tags (key → value, plain text, never encrypted),
-- written in the transaction that creates the job and recorded in its `job_created` too; the
-- index serves `jobs list --tag K=V`. `archived_jobs`: one row per job removed from the live
-- store by retention (its tombstone): its seal's hash, and where its pack was written (path and
-- the SHA-256 of the archive file; both NULL when the policy keeps no archive). The seal row
-- itself stays (a logged seal cannot be deleted), so a removed job still proves its place in the
-- transparency log. `retention_policy`: the one policy, and the lease under which one worker at
-- a time applies it. `retention_holds`: jobs an operator holds (a legal hold, an inquiry):
-- retention never removes them while held. A store opened read-only reads the schema before
-- this migration: no job has tags and none was archived.
CREATE TABLE job_tags (
    job_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (job_id, key)
);
CREATE INDEX job_tags_lookup ON job_tags (key, value, job_id);
CREATE TABLE archived_jobs (
    job_id      TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    plan_name   TEXT,
    status      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    seal_sha256 TEXT NOT NULL,
    pack_path   TEXT,
    pack_sha256 TEXT,
    archived_at TEXT NOT NULL,
    idempotency_key TEXT,
    CHECK ((pack_path IS NULL) = (pack_sha256 IS NULL))
);
CREATE INDEX archived_jobs_at ON archived_jobs (archived_at, job_id);
-- a job's idempotency key stays taken after retention removed it (never a second job)
CREATE UNIQUE INDEX archived_jobs_key ON archived_jobs (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE retention_policy (
    id                     INTEGER PRIMARY KEY CHECK (id = 1),
    finished_older_than_s  INTEGER,
    archive_dir            TEXT,
    updated_at             TEXT,
    lease_owner            TEXT,
    lease_until            REAL,
    last_run_at            TEXT,
    last_archived          INTEGER
);
INSERT INTO retention_policy (id) VALUES (1);
CREATE TABLE retention_holds (
    job_id  TEXT PRIMARY KEY,
    reason  TEXT NOT NULL,
    held_at TEXT NOT NULL
);
