-- older schema readable
-- One leaf per record in the transparency log, and the first one wins (see
-- docs/transparency.md "One leaf per job"): the record's id is the leaf's job_id.
-- A second leaf for a job id is refused (a trigger rather than a unique index, so that a
-- database that already holds one migrates, and verification reports it); the sequencer takes
-- such a leaf out of its queue and keeps it here, as evidence an operator can list
-- (`affidavit log rejected`); and the seal of a job whose leaf is logged cannot be updated or
-- deleted.
CREATE TRIGGER tlog_leaves_one_per_job BEFORE INSERT ON tlog_leaves
WHEN EXISTS (SELECT 1 FROM tlog_leaves WHERE job_id = NEW.job_id)
BEGIN
    SELECT RAISE(ABORT, 'tlog_leaves: the log already holds a leaf for this job id');
END;
CREATE TABLE tlog_rejected (
    seq         INTEGER PRIMARY KEY,
    job_id      TEXT NOT NULL,
    leaf        BLOB NOT NULL,
    queued_at   REAL NOT NULL,
    rejected_at REAL NOT NULL,
    reason      TEXT NOT NULL,
    first_index INTEGER
);
CREATE TRIGGER seals_logged_no_update BEFORE UPDATE ON seals
WHEN EXISTS (SELECT 1 FROM tlog_leaves WHERE job_id = OLD.job_id)
BEGIN
    SELECT RAISE(ABORT, 'seals: the seal of a job in the transparency log cannot change');
END;
CREATE TRIGGER seals_logged_no_delete BEFORE DELETE ON seals
WHEN EXISTS (SELECT 1 FROM tlog_leaves WHERE job_id = OLD.job_id)
BEGIN
    SELECT RAISE(ABORT, 'seals: the seal of a job in the transparency log cannot change');
END;
