-- older schema readable
-- Job listings in their order. A listing is newest first, the job id breaking ties
-- (created_at DESC, job_id DESC): with the tie-breaker in the index, the first page (or a
-- page of ids, as `verify --all` reads them) is read off the index in order instead of the
-- matching jobs being sorted, and a deep page skips index entries only. A status or a
-- namespace filter gets such an index of its own: before, `jobs list --status completed`
-- sorted every completed job to show 50. (status, namespace) served only the equality; the
-- claim query reads the status alone, which the new index leads with too.
DROP INDEX jobs_created;
CREATE INDEX jobs_created ON jobs (created_at, job_id);
DROP INDEX jobs_status;
CREATE INDEX jobs_status ON jobs (status, created_at, job_id);
CREATE INDEX jobs_namespace ON jobs (namespace, created_at, job_id);
