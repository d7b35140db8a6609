-- older schema readable
-- Queues with limits (see affidavit.store.queues). A job names its queue (NULL: the default
-- queue, unlimited, claimed as before), its priority (lower first), its partition key and the
-- time before which it is not claimed. A queue's configuration is a row of `queues`: a claim
-- from the queue locks that row first, so claims of one queue are serialized and the count of
-- its running jobs (derived from the jobs' state and live leases, never kept as a counter)
-- that the claim checks is the count it changes. Each claim from a limited queue records its
-- grant: the attempt, the slot it took (the number of the queue's jobs running before it) and
-- whether it started the job (a first claim, which the queue's rate counts).
ALTER TABLE jobs ADD COLUMN queue TEXT;
ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN partition_key TEXT;
ALTER TABLE jobs ADD COLUMN not_before REAL;
CREATE INDEX jobs_queue ON jobs (queue, status, priority, created_at, job_id)
    WHERE queue IS NOT NULL;
CREATE INDEX jobs_queue_partition ON jobs (queue, partition_key, status)
    WHERE partition_key IS NOT NULL;
CREATE TABLE queues (
    name               TEXT PRIMARY KEY,
    concurrency        INTEGER,
    worker_concurrency INTEGER,
    rate_count         INTEGER,
    rate_period        REAL,
    priority           INTEGER NOT NULL DEFAULT 0,
    partitioned        INTEGER NOT NULL DEFAULT 0,
    updated_at         TEXT NOT NULL
);
CREATE TABLE queue_grants (
    queue      TEXT NOT NULL,
    job_id     TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    owner      TEXT NOT NULL,
    slot       INTEGER NOT NULL,
    started    INTEGER NOT NULL,
    claimed_at REAL NOT NULL,
    PRIMARY KEY (job_id, attempt_id)
);
CREATE INDEX queue_grants_window ON queue_grants (queue, started, claimed_at);
