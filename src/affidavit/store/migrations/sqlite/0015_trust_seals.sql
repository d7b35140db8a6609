-- older schema readable
-- A claim moves its author's trust once, and each agent's trust log is sealed like a job's log
-- (docs/claims.md "Trust", docs/formats.md "Trust-log seals").
--
-- claim_outcomes: the verification that moved trust for a recorded claim (the first one that
-- judged it); later verifications of the claim are evidence, compared with it, and move
-- nothing. Filled from the evidence already recorded.
CREATE TABLE claim_outcomes (
    claim_id        TEXT PRIMARY KEY REFERENCES claims (claim_id),
    agent_id        TEXT NOT NULL REFERENCES agents (agent_id),
    verification_id TEXT NOT NULL UNIQUE,
    verdict         TEXT NOT NULL CHECK (verdict IN ('accurate', 'inaccurate'))
);
INSERT INTO claim_outcomes (claim_id, agent_id, verification_id, verdict)
    SELECT json_extract(CAST(v.evidence AS TEXT), '$.claim_id'), v.agent_id, v.verification_id,
           v.verdict
    FROM claim_verifications v
    WHERE v.verdict <> 'error'
      AND json_extract(CAST(v.evidence AS TEXT), '$.claim_id') IN (SELECT claim_id FROM claims)
    ORDER BY v.seq
    ON CONFLICT DO NOTHING;
CREATE TRIGGER claim_outcomes_no_update BEFORE UPDATE ON claim_outcomes
BEGIN
    SELECT RAISE(ABORT, 'claim_outcomes is append-only: an outcome cannot be changed');
END;
CREATE TRIGGER claim_outcomes_no_delete BEFORE DELETE ON claim_outcomes
BEGIN
    SELECT RAISE(ABORT, 'claim_outcomes is append-only: an outcome cannot be deleted');
END;
-- One seal per trust-log length: written in the transaction that appends the entry it ends
-- at, with the signing key of job seals; its leaf is queued for the transparency log under
-- the record id trust:<agent_id>:<entry_count>.
CREATE TABLE trust_seals (
    agent_id     TEXT NOT NULL REFERENCES agents (agent_id),
    entry_count  INTEGER NOT NULL,
    chain_head   TEXT NOT NULL,
    sealed_at    TEXT NOT NULL,
    key_id       TEXT NOT NULL,
    algorithm    TEXT NOT NULL,
    signature    TEXT NOT NULL,
    PRIMARY KEY (agent_id, entry_count)
);
CREATE TRIGGER trust_seals_no_update BEFORE UPDATE ON trust_seals
BEGIN
    SELECT RAISE(ABORT, 'trust_seals is append-only: a seal cannot be changed');
END;
CREATE TRIGGER trust_seals_no_delete BEFORE DELETE ON trust_seals
BEGIN
    SELECT RAISE(ABORT, 'trust_seals is append-only: a seal cannot be deleted');
END;
