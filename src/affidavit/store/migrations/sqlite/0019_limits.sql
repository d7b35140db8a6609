-- older schema readable
-- Tool and model limits across workers (affidavit.Limit). A limited call takes a grant before
-- its T1: a row here, inserted while the limit's state row is locked, so concurrent takers of
-- one limit on any number of workers take turns. A grant is in flight while it is not released
-- and the claim that took it still holds its job's lease (a dead worker's grants end with its
-- lease: nothing to clean up, nothing leaks). The rate counts grants by their time, in
-- microseconds, which never go backwards for one limit (last_granted_us). Only the runtime
-- writes these tables; the record carries each grant in its call's tool_invocation_started.
CREATE TABLE limit_state (
    name            TEXT PRIMARY KEY,
    last_granted_us BIGINT NOT NULL DEFAULT 0,
    rate_count      BIGINT,
    period_us       BIGINT,
    concurrency     BIGINT,
    updated_at      TEXT NOT NULL
);
CREATE TABLE limit_grants (
    grant_id    TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    attempt_id  TEXT NOT NULL,
    granted_us  BIGINT NOT NULL,
    released_us BIGINT
);
CREATE INDEX limit_grants_window ON limit_grants (name, granted_us);
CREATE INDEX limit_grants_open ON limit_grants (name) WHERE released_us IS NULL;
