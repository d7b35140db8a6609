-- Claims and trust: agents, learning patterns, immutable verification records and a
-- hash-chained trust log per agent (the chain formula of the job event log).
CREATE TABLE agents (
    agent_id               TEXT PRIMARY KEY,
    namespace              TEXT NOT NULL,
    role                   TEXT NOT NULL CHECK (role IN ('observer', 'agent', 'admin')),
    trust_score            REAL NOT NULL CHECK (trust_score >= 0 AND trust_score <= 1),
    verifications          INTEGER NOT NULL DEFAULT 0,
    accurate_verifications INTEGER NOT NULL DEFAULT 0,
    error_verifications    INTEGER NOT NULL DEFAULT 0,
    created_at             TEXT NOT NULL,
    updated_at             TEXT NOT NULL
);
CREATE INDEX agents_namespace ON agents (namespace, agent_id);
CREATE TABLE learning_patterns (
    pattern_id     TEXT PRIMARY KEY,
    owner_agent_id TEXT NOT NULL REFERENCES agents (agent_id),
    namespace      TEXT NOT NULL,
    access_level   TEXT NOT NULL
        CHECK (access_level IN ('private', 'team', 'shared', 'public', 'system')),
    name           TEXT NOT NULL,
    success_count  INTEGER NOT NULL DEFAULT 0,
    failure_count  INTEGER NOT NULL DEFAULT 0,
    created_at     TEXT NOT NULL
);
-- One row per verification; evidence holds the canonical JSON document whose SHA-256 is the
-- evidence id. Rows are never changed or deleted (triggers below).
CREATE TABLE claim_verifications (
    seq             INTEGER PRIMARY KEY,
    verification_id TEXT NOT NULL UNIQUE,
    agent_id        TEXT NOT NULL REFERENCES agents (agent_id),
    claim_type      TEXT NOT NULL,
    verdict         TEXT NOT NULL CHECK (verdict IN ('accurate', 'inaccurate', 'error')),
    decided_by      TEXT NOT NULL,
    verifier_id     TEXT NOT NULL,
    verified_at     TEXT NOT NULL,
    evidence_id     TEXT NOT NULL,
    evidence        BLOB NOT NULL
);
CREATE INDEX claim_verifications_agent ON claim_verifications (agent_id, claim_type, seq);
CREATE INDEX claim_verifications_agent_seq ON claim_verifications (agent_id, seq);
CREATE TRIGGER claim_verifications_no_update BEFORE UPDATE ON claim_verifications
BEGIN
    SELECT RAISE(ABORT, 'claim_verifications is append-only: a verification record cannot be changed');
END;
CREATE TRIGGER claim_verifications_no_delete BEFORE DELETE ON claim_verifications
BEGIN
    SELECT RAISE(ABORT, 'claim_verifications is append-only: a verification record cannot be deleted');
END;
-- The trust log: per agent, versions 1..n chained like job events.
CREATE TABLE trust_log (
    agent_id    TEXT NOT NULL REFERENCES agents (agent_id),
    version     INTEGER NOT NULL,
    entry_id    TEXT NOT NULL UNIQUE,
    type        TEXT NOT NULL,
    payload     BLOB NOT NULL,
    chain_hash  TEXT NOT NULL,
    recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (agent_id, version)
);
CREATE TRIGGER trust_log_no_update BEFORE UPDATE ON trust_log
BEGIN
    SELECT RAISE(ABORT, 'trust_log is append-only: an entry cannot be changed');
END;
CREATE TRIGGER trust_log_no_delete BEFORE DELETE ON trust_log
BEGIN
    SELECT RAISE(ABORT, 'trust_log is append-only: an entry cannot be deleted');
END;
