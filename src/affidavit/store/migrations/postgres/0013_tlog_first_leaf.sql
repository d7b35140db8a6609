-- older schema readable
-- One leaf per record in the transparency log, and the first one wins (see
-- docs/transparency.md "One leaf per job"): the record's id is the leaf's job_id.
-- A second leaf for a job id is refused (a trigger rather than a unique index, so that a
-- database that already holds one migrates, and verification reports it; the sequencer's
-- inserts are serialized by its fenced update of tlog_state); the sequencer takes such a leaf
-- out of its queue and keeps it here, as evidence an operator can list (`affidavit log
-- rejected`); and the seal of a job whose leaf is logged cannot be updated or deleted.
CREATE FUNCTION affidavit_tlog_one_per_job() RETURNS TRIGGER LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tlog_leaves WHERE job_id = NEW.job_id) THEN
        RAISE EXCEPTION 'tlog_leaves: the log already holds a leaf for job %', NEW.job_id
            USING ERRCODE = 'AFL01';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER tlog_leaves_one_per_job BEFORE INSERT ON tlog_leaves
    FOR EACH ROW EXECUTE FUNCTION affidavit_tlog_one_per_job();
CREATE TABLE tlog_rejected (
    seq         BIGINT PRIMARY KEY,
    job_id      TEXT NOT NULL,
    leaf        BYTEA NOT NULL,
    queued_at   DOUBLE PRECISION NOT NULL,
    rejected_at DOUBLE PRECISION NOT NULL,
    reason      TEXT NOT NULL,
    first_index BIGINT
);
CREATE FUNCTION affidavit_logged_seal_fixed() RETURNS TRIGGER LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tlog_leaves WHERE job_id = OLD.job_id) THEN
        RAISE EXCEPTION 'seals: the seal of job % is in the transparency log and cannot change',
            OLD.job_id USING ERRCODE = 'AFL02';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;
CREATE TRIGGER seals_logged_fixed BEFORE UPDATE OR DELETE ON seals
    FOR EACH ROW EXECUTE FUNCTION affidavit_logged_seal_fixed();
