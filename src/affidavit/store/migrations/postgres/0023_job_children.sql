-- older schema readable
-- Child jobs (ctx.start_job): each child's parent job and the parent's step that created it. The
-- row is written in the transaction that creates the child. `awaited` is set by the parent's
-- transaction that makes it wait for the child (ctx.join), `ended_at` by the transaction that
-- ends the child, which makes an awaiting parent runnable again (both write this row first, so
-- they are serialized). The parent's log, not this table, is the record of the link
-- (child_completed); this table serves the wake-up and `jobs list --parent`.
CREATE TABLE job_children (
    child_job_id   TEXT PRIMARY KEY,
    parent_job_id  TEXT NOT NULL,
    parent_step_id TEXT NOT NULL,
    created_at     TEXT NOT NULL,
    awaited        INTEGER NOT NULL DEFAULT 0,
    ended_at       TEXT
);
CREATE INDEX job_children_parent ON job_children (parent_job_id, created_at);
