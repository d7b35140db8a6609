-- older schema readable
-- Crash loops. A job's lease expires with an owner only when its run ended without finishing
-- or handing the job back (the process was killed, ran out of memory, exited inside a step,
-- froze). The run that recovers such a job counts it: one more recovery when the log has as
-- many node_finished events as at the recovery before (recovery_progress), else the first. A
-- worker parks a job recovered too many times in a row (reason crash_loop) instead of running
-- it. Any other claim starts the count again. Only claims use these columns, so a store opened
-- read-only reads the schema before them.
ALTER TABLE jobs ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN recovery_progress INTEGER;
