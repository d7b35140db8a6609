-- older schema readable
-- Data subjects (docs/privacy.md). A subject is kept only as a keyed hash (subject_id); its
-- data key, wrapped by the master key, lives alone in subject_keys so that erasing the subject
-- deletes one small row (and the backend's copies of it: see affidavit erase). job_subjects
-- names each job's subject, written in the transaction that creates the job.
CREATE TABLE subjects (
    subject_id   TEXT PRIMARY KEY,
    key_id       TEXT NOT NULL,
    wrapped_by   TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    erased_at    TEXT,
    erase_reason TEXT,
    receipt      TEXT
);
CREATE TABLE subject_keys (
    subject_id  TEXT PRIMARY KEY,
    wrapped_key BYTEA NOT NULL
);
CREATE TABLE job_subjects (
    job_id     TEXT PRIMARY KEY,
    subject_id TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX job_subjects_subject ON job_subjects (subject_id, created_at);
