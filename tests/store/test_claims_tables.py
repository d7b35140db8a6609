"""The store's operations on the claims tables (migrations 4 and 11) on both backends: agents,
patterns, verifications, trust-log entries and recorded claims, as rows; and the agent's row
lock, which is the backend's own (PostgreSQL ``FOR UPDATE``; SQLite's write transaction)."""

from __future__ import annotations

import threading

from affidavit.core.errors import StoreError
from affidavit.store import Store, open_store
from affidavit.store.sqlite import SqliteStore

NOW = "2026-01-01T00:00:00.000000Z"


def _verification(n: int, agent_id: str, claim_type: str, verdict: str) -> tuple[object, ...]:
    return (f"v-{n}", agent_id, claim_type, verdict, "rule", "verifier", NOW, f"e-{n}", b"{}")


def test_agents_and_patterns_round_trip(store: Store) -> None:
    with store.transaction() as tx:
        assert tx.agent_insert("a:one", "team", "agent", 0.5, NOW)
        assert not tx.agent_insert("a:one", "other", "agent", 0.9, NOW)  # (the id is taken)
        assert tx.agent_insert("a:two", "solo", "observer", 0.7, NOW)
        assert tx.pattern_insert(("p-1", "a:one", "team", "private", "lint", NOW))
        assert not tx.pattern_insert(("p-1", "a:two", "solo", "public", "other", NOW))
    with store.transaction() as tx:
        row = tx.agent_row("a:one", for_update=True)
        assert row is not None and row[:4] == ("a:one", "team", "agent", 0.5)
        tx.agent_trust_update("a:one", 0.75, judged=True, accurate=False, now="later")
        tx.agent_trust_update("a:one", 0.25, judged=False, accurate=False, now="latest")
        tx.pattern_outcome_count("p-1", success=True)
        tx.pattern_outcome_count("p-1", success=False)
        tx.pattern_outcome_count("p-1", success=False)
    with store.transaction() as tx:
        assert tx.agent_row("a:one") == ("a:one", "team", "agent", 0.25, 1, 0, 1, NOW, "latest")
        assert tx.agent_row("a:none") is None
        assert [r[0] for r in tx.agent_rows(None)] == ["a:two", "a:one"]  # (solo < team)
        assert [r[0] for r in tx.agent_rows("team")] == ["a:one"]
        assert tx.agent_rows("nobody") == []
        assert tx.pattern_row("p-1") == ("p-1", "a:one", "team", "private", "lint", 1, 2, NOW)
        assert tx.pattern_row("p-2") is None


def test_verifications_trust_entries_and_claims_round_trip(store: Store) -> None:
    with store.transaction() as tx:
        tx.agent_insert("a:one", "team", "agent", 0.5, NOW)
        for n, (kind, verdict) in enumerate(
            [("tests", "accurate"), ("build", "error"), ("tests", "inaccurate")], start=1
        ):
            tx.verification_insert(_verification(n, "a:one", kind, verdict))
        assert tx.trust_head("a:one") is None
        tx.trust_entry_insert(("a:one", 1, "t-1", "agent_registered", b"{}", "ab" * 32))
        tx.trust_entry_insert(("a:one", 2, "t-2", "trust_changed", b'{"x":1}', "cd" * 32))
        tx.claim_insert(("c-1", "a:one", "team", "tests", b'{"k":1}', "true", NOW))
    with store.transaction() as tx:
        evidence = tx.verification_evidence("a:one", None, 10)
        assert [(e[0], bytes(e[1])) for e in evidence] == [
            ("e-3", b"{}"),
            ("e-2", b"{}"),
            ("e-1", b"{}"),
        ]
        assert [e[0] for e in tx.verification_evidence("a:one", "tests", 1)] == ["e-3"]
        assert [tuple(r) for r in tx.verdict_counts("a:one")] == [
            ("build", "error", 1),
            ("tests", "accurate", 1),
            ("tests", "inaccurate", 1),
        ]
        assert [(r[0], r[1], r[3]) for r in tx.verification_rows("a:one")] == [
            ("v-1", "e-1", "accurate"),
            ("v-2", "e-2", "error"),
            ("v-3", "e-3", "inaccurate"),
        ]
        assert [r[0] for r in tx.verifications_recent("a:one", 2)] == ["v-3", "v-2"]
        found = tx.verification_evidence_of("v-2")
        assert found is not None and found[0] == "e-2"
        assert tx.verification_evidence_of("v-9") is None
        assert tx.trust_head("a:one") == (2, "cd" * 32)
        assert [(r[1], r[2], bytes(r[4])) for r in tx.trust_entries("a:one")] == [
            (1, "t-1", b"{}"),
            (2, "t-2", b'{"x":1}'),
        ]
        claim = tx.claim_row("c-1")
        assert claim is not None and claim[:4] == ("c-1", "a:one", "team", "tests")
        assert bytes(claim[4]) == b'{"k":1}'
        assert tx.claim_row("c-2") is None


def _second_store(store: Store) -> Store:
    """Another store on the same database that gives up waiting for a lock soon."""
    if isinstance(store, SqliteStore):
        return SqliteStore(store.url, store.path, busy_timeout_s=0.2)
    return open_store(store.url)


def test_the_agent_row_lock_holds_off_a_second_writer(store: Store) -> None:
    """While one transaction holds an agent's row ``for_update``, another writer cannot take
    it: on PostgreSQL the row lock (the second locker gives up at its lock timeout), on SQLite
    the write transaction itself (the second writer gives up at its busy timeout). Once the
    first commits, the row is free."""
    with store.transaction() as tx:
        tx.agent_insert("a:one", "team", "agent", 0.5, NOW)
    other = _second_store(store)
    refused: list[StoreError] = []

    def second_writer() -> None:
        try:
            with other.transaction() as tx2:
                if other.backend == "postgresql":
                    tx2.execute("SET LOCAL lock_timeout = '200ms'")
                tx2.agent_row("a:one", for_update=True)
        except StoreError as exc:
            refused.append(exc)

    try:
        with store.transaction() as tx:
            assert tx.agent_row("a:one", for_update=True) is not None
            thread = threading.Thread(target=second_writer)
            thread.start()
            thread.join(timeout=30)
            assert not thread.is_alive()
        assert len(refused) == 1
        with other.transaction() as tx2:
            assert tx2.agent_row("a:one", for_update=True) is not None
    finally:
        other.close()
