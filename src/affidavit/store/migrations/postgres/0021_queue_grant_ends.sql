-- older schema readable
-- The end of each queue grant: when the claim's hold on its slot ended, and how. A trigger
-- writes it in the transaction of the job's change that ends the hold, whichever statement
-- makes it (the run's end, a wait, a park, a cancel, a lease handed back, a claim taking over
-- an expired lease), so no path can end a hold without recording it. The hold ends at the
-- earlier of the lease's expiry and the time of that change (the database's clock): a lease
-- that expired before the change ended the hold then (`ended_as` = 'lease_expired'). A hold
-- still on its job (the grant's attempt still the job's, running) has no end yet: its lease
-- expiry, on the job's row, is its end once past.
ALTER TABLE queue_grants ADD COLUMN ended_at DOUBLE PRECISION;
ALTER TABLE queue_grants ADD COLUMN ended_as TEXT;
CREATE OR REPLACE FUNCTION affidavit_queue_grant_end() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t DOUBLE PRECISION := extract(epoch FROM clock_timestamp())::double precision;
BEGIN
    UPDATE queue_grants SET
        ended_at = LEAST(COALESCE(OLD.lease_expires_at, t), t),
        ended_as = CASE
            WHEN OLD.lease_expires_at < t THEN 'lease_expired'
            WHEN NEW.status <> 'running' THEN NEW.status
            ELSE 'released'
        END
    WHERE job_id = OLD.job_id AND attempt_id = OLD.attempt_id AND ended_at IS NULL;
    RETURN NULL;
END
$$;
CREATE TRIGGER queue_grant_end AFTER UPDATE OF status, attempt_id, lease_owner ON jobs
    FOR EACH ROW WHEN (
        OLD.queue IS NOT NULL AND OLD.status = 'running' AND OLD.lease_owner IS NOT NULL
        AND (NEW.status <> 'running' OR NEW.attempt_id IS DISTINCT FROM OLD.attempt_id
             OR NEW.lease_owner IS DISTINCT FROM OLD.lease_owner)
    )
    EXECUTE FUNCTION affidavit_queue_grant_end();
