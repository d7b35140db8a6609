-- older schema readable
-- Claims recorded by the agent that makes them (POST /api/claims, `affidavit claims make`),
-- verified later by another agent by id. Rows are never changed or deleted.
CREATE TABLE claims (
    claim_id    TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL REFERENCES agents (agent_id),
    namespace   TEXT NOT NULL,
    claim_type  TEXT NOT NULL,
    content     BLOB NOT NULL,
    command     TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX claims_agent ON claims (agent_id, created_at);
CREATE TRIGGER claims_no_update BEFORE UPDATE ON claims
BEGIN
    SELECT RAISE(ABORT, 'claims is append-only: a claim cannot be changed');
END;
CREATE TRIGGER claims_no_delete BEFORE DELETE ON claims
BEGIN
    SELECT RAISE(ABORT, 'claims is append-only: a claim cannot be deleted');
END;
