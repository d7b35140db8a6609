"""``ClaimService``: verify what agents claim by running the check, keep the evidence, and move
each agent's trust score only on that evidence."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from affidavit.claims import evidence, kinds, made, records, views
from affidavit.claims.bwrap import require_bwrap
from affidavit.claims.compare import judge, parse_claim
from affidavit.claims.made import Claim, ClaimNotFound
from affidavit.claims.model import (
    ACCESS_LEVELS,
    VERIFIER_ROLES,
    Agent,
    ClaimType,
    ClaimVerdict,
    Pattern,
    Role,
    TrustEntry,
    check_ident,
    claim_type,
    role,
)
from affidavit.claims.recording import Recorder
from affidavit.claims.sandbox import SandboxConfig, parse_command, run_command
from affidavit.claims.sealing import TrustSealer, append_sealed
from affidavit.claims.trust import TrustPolicy
from affidavit.core.canonical import parse
from affidavit.core.errors import (
    AgentExistsError,
    AgentNotFound,
    NamespaceForbidden,
    SelfVerificationError,
    TamperedRecordError,
    ValidationError,
    VerifierRoleForbidden,
)
from affidavit.core.events import utc_now
from affidavit.core.ids import uuid7
from affidavit.core.signing import default_key_path
from affidavit.store import Store, Transaction, database_file

MAX_HISTORY = 1000
RECENT = 10


class ClaimService:
    """Claims and trust over one :class:`~affidavit.store.Store`.

    ``sandbox`` says which commands may run and how they are contained; ``trust`` holds the
    trust math's parameters. Both have safe defaults (docs/claims.md).
    """

    def __init__(
        self,
        store: Store,
        *,
        sandbox: SandboxConfig | None = None,
        trust: TrustPolicy | None = None,
        sealer: TrustSealer | None = None,
    ) -> None:
        self.store = store
        # every trust-log entry is sealed with the store's signing key (loaded on first write)
        self.sealer = sealer or TrustSealer.for_url(store.url)
        config = sandbox or SandboxConfig()
        # The service's own secrets are never shown to a command, whatever the configuration.
        self.sandbox = replace(
            config, protected_paths=(*config.protected_paths, *protected_paths(store.url))
        )
        self.trust = trust or TrustPolicy()

    @contextmanager
    def _tx(self, *, durable: bool = False) -> Iterator[Transaction]:
        with self.store.transaction(durable=durable) as tx:
            yield tx

    def agent_dict(self, agent: Agent) -> dict[str, Any]:
        return agent.to_dict(
            threshold=self.trust.requires_verification_below,
            reliable_after=self.trust.reliable_after,
        )

    # --- agents and patterns ----------------------------------------------------------------

    def add_agent(self, agent_id: str, *, namespace: str = "default", role: str = "agent") -> Agent:
        """Register an agent with the initial trust score; its trust log starts with an
        ``agent_registered`` entry.

        Raises:
            ValidationError: a malformed id or namespace, or an unknown role.
            AgentExistsError: the id is taken (nothing is written).
        """
        check_ident(agent_id, "agent id")
        check_ident(namespace, "namespace")
        the_role = _role(role)
        score = self.trust.initial_score
        with self._tx(durable=True) as tx:
            if not records.insert_agent(tx, agent_id, namespace, the_role, score):
                raise AgentExistsError(f"agent {agent_id!r} already exists")
            append_sealed(
                tx,
                self.sealer,
                agent_id,
                "agent_registered",
                {
                    "at": utc_now(),
                    "agent_id": agent_id,
                    "namespace": namespace,
                    "role": the_role,
                    "trust_score": score,
                },
            )
            agent = records.get_agent(tx, agent_id)
        assert agent is not None
        return agent

    def get_agent(self, agent_id: str) -> Agent:
        """Raises :class:`AgentNotFound`."""
        with self._tx() as tx:
            agent = records.get_agent(tx, agent_id)
        if agent is None:
            raise AgentNotFound(agent_id)
        return agent

    def list_agents(self, namespace: str | None = None) -> list[Agent]:
        """Agents ordered by namespace and id."""
        with self._tx() as tx:
            return records.list_agents(tx, namespace)

    def add_pattern(
        self,
        owner_agent_id: str,
        *,
        access_level: str,
        pattern_id: str | None = None,
        name: str = "",
        namespace: str | None = None,
    ) -> Pattern:
        """Register a learning pattern owned by an agent (in the owner's namespace unless
        another is given).

        Raises:
            AgentNotFound: no such owner.
            ValidationError: unknown access level, malformed or taken pattern id.
        """
        if access_level not in ACCESS_LEVELS:
            raise ValidationError(
                f"unknown access level {access_level!r}",
                hint=f"Access levels: {', '.join(ACCESS_LEVELS)}.",
            )
        pid = check_ident(pattern_id, "pattern id") if pattern_id is not None else str(uuid7())
        with self._tx(durable=True) as tx:
            owner = records.get_agent(tx, owner_agent_id)
            if owner is None:
                raise AgentNotFound(owner_agent_id, what="pattern owner")
            ns = check_ident(namespace, "namespace") if namespace is not None else owner.namespace
            if not records.insert_pattern(tx, pid, owner_agent_id, ns, access_level, name):
                raise ValidationError(f"pattern {pid!r} already exists")
            pattern = records.get_pattern(tx, pid)
        assert pattern is not None
        return pattern

    def get_pattern(self, pattern_id: str) -> Pattern | None:
        with self._tx() as tx:
            return records.get_pattern(tx, pattern_id)

    # --- verification -----------------------------------------------------------------------

    def verify_claim(
        self,
        agent_id: str,
        claim_type: ClaimType | str,
        claim_content: Mapping[str, Any],
        command: str,
        verifier_id: str,
        *,
        timeout_s: float | None = None,
        claim_id: str | None = None,
    ) -> ClaimVerdict:
        """Judge ``agent_id``'s claim by running ``command`` on behalf of ``verifier_id``.
        (Served to agents only for a claim the claimant recorded itself: see
        :meth:`verify_made_claim`; this form, whose caller supplies the claim, is the
        operator's and an admin's.)

        The checks, in order — each refusal raises before anything runs or is written:

        (1) the verifier is not the claimant (:class:`SelfVerificationError`);
        (2) both agents exist (:class:`AgentNotFound`);
        (3) the verifier's role is ``agent`` or ``admin`` (:class:`VerifierRoleForbidden`);
        (4) the verifier is in the claimant's namespace, or an admin (:class:`NamespaceForbidden`);
        (5) the claim type is known and the claim well-formed (:class:`InvalidClaim`, a
            :class:`ValidationError`);
        (6) the command is allow-listed (:class:`CommandNotAllowed`) and can prove a claim of
            its type (:class:`~affidavit.claims.kinds.CommandUnfitForClaim`).

        Then (7) the command runs in the sandbox, (8) the run is judged, and (9) one
        transaction — holding the claimant's row lock — stores the immutable evidence record,
        moves the trust score (not on an ``error`` verdict, and for a recorded claim only at
        the first verification that judges it: :mod:`affidavit.claims.once`), applies a linked
        pattern's delta at most once, and appends to the claimant's trust log with its seal
        (:mod:`affidavit.claims.sealing`).

        Raises:
            StoreError: the database failed (the command may have run; nothing is recorded).
            SigningKeyError: the signing key cannot be read or created, so the trust-log entry
                could not be sealed (checked before the command runs; nothing is recorded).
        """
        claimant = self._claimant_for(agent_id, verifier_id)  # (1)-(4)
        # (5)
        kind = _claim_type(claim_type)
        rules = parse_claim(claim_content)
        if timeout_s is not None and not (
            isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0
        ):
            raise ValidationError(f"timeout must be a positive number of seconds, not {timeout_s}")
        # (6)
        cmd = parse_command(command, self.sandbox)
        kinds.check(kind, rules, cmd.argv)
        if self.sandbox.isolation == "bwrap":
            require_bwrap()
        self.sealer.key()  # (its entry is sealed: a key that cannot be used refuses it now)
        # (7), (8)
        run = run_command(cmd, self.sandbox, timeout_s=timeout_s)
        verdict = judge(rules, run)
        # (9)
        recorder = self._recorder()
        record = recorder.evidence(
            claimant, verifier_id, kind, rules, run, verdict, timeout_s, claim_id
        )
        return recorder.record(record, rules, verdict)

    def _claimant_for(self, agent_id: str, verifier_id: str) -> Agent:
        """Checks (1)-(4) of :meth:`verify_claim`: the claimant, once ``verifier_id`` may
        verify its claims."""
        # (1)
        if verifier_id == agent_id:
            raise SelfVerificationError(f"agent {agent_id!r} cannot verify its own claim")
        # (2)
        with self._tx() as tx:
            claimant = records.get_agent(tx, agent_id)
            verifier = records.get_agent(tx, verifier_id)
        if claimant is None:
            raise AgentNotFound(agent_id)
        if verifier is None:
            raise AgentNotFound(verifier_id, what="verifier")
        # (3)
        if verifier.role not in VERIFIER_ROLES:
            raise VerifierRoleForbidden(
                f"verifier {verifier_id!r} has role {verifier.role!r}; verifying requires "
                "agent or admin"
            )
        # (4)
        if verifier.role != Role.ADMIN and verifier.namespace != claimant.namespace:
            raise NamespaceForbidden(
                f"verifier {verifier_id!r} (namespace {verifier.namespace!r}) may not verify "
                f"claims of {agent_id!r} (namespace {claimant.namespace!r})"
            )
        return claimant

    def _recorder(self) -> Recorder:
        return Recorder(self.store, self.sandbox, self.trust, self.sealer)

    # --- claims made by their own agent ------------------------------------------------------

    def make_claim(
        self,
        agent_id: str,
        claim_type: ClaimType | str,
        claim_content: Mapping[str, Any],
        command: str,
    ) -> Claim:
        """Record ``agent_id``'s own claim and the command that checks it; nothing runs yet.

        Raises:
            AgentNotFound: no such agent.
            ValidationError: unknown claim type, malformed claim, or a command that would be
                refused (:class:`CommandNotAllowed`, also one unfit for the claim type) —
                nothing is written.
        """
        kind = _claim_type(claim_type)
        rules = parse_claim(claim_content)
        kinds.check(kind, rules, parse_command(command, self.sandbox).argv)
        with self._tx(durable=True) as tx:
            agent = records.get_agent(tx, agent_id)
            if agent is None:
                raise AgentNotFound(agent_id)
            claim = Claim(
                str(uuid7()),
                agent.agent_id,
                agent.namespace,
                kind.value,
                dict(rules.content),
                command,
                utc_now(),
            )
            made.insert(tx, claim)
        return claim

    def get_claim(self, claim_id: str) -> Claim:
        """Raises :class:`ClaimNotFound`."""
        with self._tx() as tx:
            claim = made.get(tx, claim_id)
        if claim is None:
            raise ClaimNotFound(f"claim {claim_id!r} not found")
        return claim

    def verify_made_claim(
        self, claim_id: str, verifier_id: str, *, timeout_s: float | None = None
    ) -> ClaimVerdict:
        """Verify the claim its agent recorded (:meth:`make_claim`) on behalf of
        ``verifier_id``, with the checks and the record of :meth:`verify_claim`; the evidence
        names the ``claim_id``.

        Raises:
            ClaimNotFound: no such claim; and everything :meth:`verify_claim` raises.
        """
        claim = self.get_claim(claim_id)
        return self.verify_claim(
            claim.agent_id,
            claim.claim_type,
            claim.claim,
            claim.command,
            verifier_id,
            timeout_s=timeout_s,
            claim_id=claim.claim_id,
        )

    # --- reading ----------------------------------------------------------------------------

    def get_evidence(self, verification_id: str) -> dict[str, Any] | None:
        """The stored evidence document with its ``evidence_id`` (the SHA-256 of its stored
        canonical bytes), or ``None``."""
        with self._tx() as tx:
            found = records.get_evidence(tx, verification_id)
        if found is None:
            return None
        evidence_id, body = found
        doc = _evidence_doc(None, evidence_id, body)
        evidence.check_body(records.evidence_name(None, evidence_id), evidence_id, body)
        return {"evidence_id": evidence_id, **doc}

    def get_verification_history(
        self, agent_id: str, claim_type: ClaimType | str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The agent's evidence records, newest first, optionally of one claim type.

        Raises:
            AgentNotFound: no such agent.
            ValidationError: unknown claim type, or ``limit`` outside 1–1000.
        """
        kind = _claim_type(claim_type).value if claim_type is not None else None
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_HISTORY:
            raise ValidationError(f"limit must be an integer in 1–{MAX_HISTORY}, not {limit!r}")
        with self._tx() as tx:
            if records.get_agent(tx, agent_id) is None:
                raise AgentNotFound(agent_id)
            rows = records.history(tx, agent_id, kind, limit)
            expected = evidence.logged(records.trust_log(tx, agent_id))
        out = []
        for evidence_id, body in rows:
            where = records.evidence_name(agent_id, evidence_id)
            doc = _evidence_doc(agent_id, evidence_id, body)
            entry = expected.get(str(doc.get("verification_id")))
            problem = evidence.row_problem(
                str(doc.get("verification_id")), evidence_id, body, str(doc.get("verdict")),
                doc, entry,
            )  # fmt: skip
            if problem is not None:
                raise TamperedRecordError(where, problem)
            out.append({"evidence_id": evidence_id, **doc})
        return out

    def get_verification_statistics(self, agent_id: str) -> dict[str, Any]:
        """Totals, accuracy (accurate / judged; ``error`` verdicts are counted apart), the
        same by claim type, and the last 10 verifications — counted from verdicts that verify
        against their evidence and the trust log.

        Raises:
            AgentNotFound: no such agent.
            TamperedRecordError: an evidence record does not match its id or its trust log entry.
        """
        with self._tx() as tx:
            agent = records.get_agent(tx, agent_id)
            if agent is None:
                raise AgentNotFound(agent_id)
            counts = records.verdict_counts(tx, agent_id)
            latest = records.recent(tx, agent_id, RECENT)
            rows = records.evidence_rows(tx, agent_id)
            entries = records.trust_log(tx, agent_id)
        problems = evidence.cross_check(
            agent_id, [(v, e, b, d, _evidence_doc(agent_id, e, b)) for v, e, b, d in rows], entries
        )
        if problems:
            where, _, problem = problems[0].rpartition(": ")
            raise TamperedRecordError(where, problem)
        by_type: dict[str, dict[str, Any]] = {}
        for kind, verdict, n in counts:
            entry = by_type.setdefault(
                kind, {"total": 0, "accurate": 0, "inaccurate": 0, "errors": 0}
            )
            entry["errors" if verdict == "error" else verdict] += n
        for entry in by_type.values():
            entry["total"] = entry["accurate"] + entry["inaccurate"]
            entry["accuracy"] = entry["accurate"] / entry["total"] if entry["total"] else 0.0
        judged = sum(e["total"] for e in by_type.values())
        accurate = sum(e["accurate"] for e in by_type.values())
        return {
            **self.agent_dict(agent),
            "total_verifications": judged,
            "accurate_verifications": accurate,
            "inaccurate_verifications": judged - accurate,
            "error_verifications": sum(e["errors"] for e in by_type.values()),
            "accuracy_rate": accurate / judged if judged else 0.0,
            "by_claim_type": by_type,
            "recent_verifications": [
                {
                    "verification_id": r[0],
                    "claim_type": r[1],
                    "verdict": r[2],
                    "accurate": r[2] == "accurate",
                    "decided_by": r[3],
                    "verified_at": r[4],
                }
                for r in latest
            ],
        }

    def get_trust_history(self, agent_id: str) -> list[TrustEntry]:
        """The agent's trust log, oldest first.

        Raises:
            AgentNotFound: no such agent.
        """
        with self._tx() as tx:
            if records.get_agent(tx, agent_id) is None:
                raise AgentNotFound(agent_id)
            return records.trust_log(tx, agent_id)

    def check_trust_log(self, agent_id: str) -> dict[str, Any]:
        """Verify the agent's trust log (:func:`affidavit.verify.check_trust_log`: its chain,
        its seal and the transparency log's leaves, the scores it states and the agent's
        current score) and every evidence record against its id and its trust log entry
        (:mod:`affidavit.claims.evidence`): ``{"ok", "entries", "first_bad_version", "root",
        "score_matches", "evidence_ok", "evidence_problems", "sealed", "seal", "problems",
        "disagreements"}`` — ``problems`` lists every failed check in words, ``disagreements``
        the re-verifications judged otherwise than the verification that counted.

        Raises:
            AgentNotFound: no such agent.
        """
        from affidavit.verify import check_trust_log

        with self._tx() as tx:
            agent = records.get_agent(tx, agent_id)
            if agent is None:
                raise AgentNotFound(agent_id)
            entries = records.trust_log(tx, agent_id)
            rows = records.evidence_rows(tx, agent_id)
            try:
                seal = tx.trust_seal_latest(agent_id)
            except ValueError as exc:
                raise TamperedRecordError(f"agent {agent_id}, trust seal", str(exc)) from None
            keys = tx.keys_list()
            leaves = {
                rid: tx.tlog_record_leaf(rid)
                for rid in views.record_ids_to_check(agent_id, len(entries), seal)
            }
        problems = evidence.cross_check(
            agent_id,
            [(v, e, b, d, _evidence_doc(agent_id, e, b)) for v, e, b, d in rows],
            entries,
        )
        check = check_trust_log(
            agent_id,
            [(e.version, e.entry_id, e.type, e.payload_bytes, e.chain_hash) for e in entries],
            score=agent.trust_score,
            seal=seal,
            keys=keys,
            leaf_of=lambda rid: leaves.get(rid, (None, False)),
        )
        return {
            "ok": check.ok and not problems,
            "entries": check.entries,
            "first_bad_version": check.first_bad_version,
            "root": check.root,
            "score_matches": check.score_matches,
            "evidence_ok": not problems,
            "evidence_problems": problems,
            "sealed": seal is not None,
            "seal": check.seal,
            "problems": check.problems + problems,
            "disagreements": views.disagreements(entries),
        }

    def check_trust_logs(self, namespace: str | None = None) -> tuple[int, dict[str, list[str]]]:
        """:meth:`check_trust_log` of every agent (of ``namespace``, or all): the number of
        agents and, by agent id, the problems of those whose log or evidence does not verify
        (what ``affidavit verify --all`` reports)."""
        bad: dict[str, list[str]] = {}
        agents = self.list_agents(namespace)
        for agent in agents:
            try:
                check = self.check_trust_log(agent.agent_id)
            except TamperedRecordError as exc:
                bad[agent.agent_id] = [exc.message]
                continue
            if not check["ok"]:
                bad[agent.agent_id] = list(check["problems"])
        return len(agents), bad

    def claim_view(self, claim_id: str) -> dict[str, Any]:
        """The recorded claim with its verifications as its claimant's trust log states them
        (oldest first; ``counted`` names the one that moved trust, ``disagrees`` flags those
        judged otherwise) and ``disagreements``, how many are flagged.

        Raises:
            ClaimNotFound: no such claim.
        """
        claim = self.get_claim(claim_id)
        with self._tx() as tx:
            entries = records.trust_log(tx, claim.agent_id)
        verifications = views.claim_verifications(entries, claim_id)
        return {
            **claim.to_dict(),
            "verifications": verifications,
            "disagreements": sum(1 for v in verifications if v["disagrees"]),
        }


def protected_paths(db_url: str) -> tuple[str, ...]:
    """What a claim command must never see: the signing key (and its directory) and, on
    SQLite, the database file's directory (the data directory)."""
    key = default_key_path(db_url)
    paths = [str(key), str(key.parent)]
    db_file = database_file(db_url)
    if db_file is not None:
        paths.append(str(db_file.parent))
    return tuple(paths)


def _role(value: str) -> str:
    return role(value).value


def _claim_type(value: Any) -> ClaimType:
    return claim_type(value)


def _evidence_doc(agent_id: str | None, evidence_id: str, body: bytes) -> dict[str, Any]:
    """A stored evidence document, decoded.

    Raises:
        TamperedRecordError: it is not a JSON object (edited outside affidavit).
    """
    try:
        doc = parse(body)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise TamperedRecordError(
            records.evidence_name(agent_id, evidence_id), "the stored evidence is not a JSON object"
        )
    return doc
