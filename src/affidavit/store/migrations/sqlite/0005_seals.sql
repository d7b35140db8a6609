-- Seals of finished jobs and the public keys that check them. Private keys never enter the
-- database. A key stays here after rotation, so seals it signed keep verifying.
CREATE TABLE signing_keys (
    key_id     TEXT PRIMARY KEY,
    algorithm  TEXT NOT NULL,
    public_key TEXT NOT NULL,
    created_at TEXT NOT NULL,
    retired_at TEXT
);
-- One seal per job, written in the transaction that appends the job's terminal event.
CREATE TABLE seals (
    job_id                TEXT PRIMARY KEY,
    event_count           INTEGER NOT NULL,
    event_chain_root_hash TEXT NOT NULL,
    sealed_at             TEXT NOT NULL,
    key_id                TEXT NOT NULL,
    algorithm             TEXT NOT NULL,
    signature             TEXT NOT NULL
);
