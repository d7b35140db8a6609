-- older schema readable
-- The checks of an append by a writer that knows the job's head (a run holding the job's
-- lease), made on the server: lock the job's row, then (a statement of its own, so under READ
-- COMMITTED it sees what the lock's previous holder committed) read its head, and refuse with
-- an error — which aborts the transaction — when the job is missing (AFJ01), the fence does not
-- hold (AFJ02), the log is not at the expected version (AFJ03) or its last chain hash is not
-- the writer's (AFJ04); DETAIL holds what the client needs to say so, as a JSON object. The
-- writer queues the call with its inserts and commit (one round trip); the client turns these
-- errors into the ones its own check raises. Only writers call it, so a store
-- opened read-only reads the schema before it.
CREATE OR REPLACE FUNCTION affidavit_append_guard(
    p_job_id TEXT, p_fence TEXT, p_version BIGINT, p_head TEXT
) RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    v_attempt TEXT;
    v_version BIGINT;
    v_head TEXT;
BEGIN
    SELECT attempt_id INTO v_attempt FROM jobs WHERE job_id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no job %', p_job_id
            USING ERRCODE = 'AFJ01', DETAIL = json_build_object('job_id', p_job_id)::text;
    END IF;
    IF p_fence IS NOT NULL AND v_attempt IS DISTINCT FROM p_fence THEN
        RAISE EXCEPTION 'job % is fenced off for attempt %', p_job_id, p_fence
            USING ERRCODE = 'AFJ02', DETAIL = json_build_object(
                'job_id', p_job_id, 'fence', p_fence, 'current', v_attempt)::text;
    END IF;
    SELECT version, chain_hash INTO v_version, v_head
        FROM events WHERE job_id = p_job_id ORDER BY version DESC LIMIT 1;
    IF NOT FOUND THEN
        v_version := 0;
        v_head := NULL;
    END IF;
    IF v_version <> p_version THEN
        RAISE EXCEPTION 'job % is at version %, not %', p_job_id, v_version, p_version
            USING ERRCODE = 'AFJ03', DETAIL = json_build_object(
                'job_id', p_job_id, 'expected', p_version, 'actual', v_version)::text;
    END IF;
    IF v_head IS DISTINCT FROM p_head THEN
        RAISE EXCEPTION 'job %: the chain head at version % is not the writer''s', p_job_id,
            p_version USING ERRCODE = 'AFJ04', DETAIL = json_build_object(
                'job_id', p_job_id, 'expected', p_version, 'actual', p_version)::text;
    END IF;
END
$$;
