"""The ledger proof's row checks, one disagreement each, on a small synthetic log (the
committed-and-matching row is taken on a short path; every other row on the full one)."""

from __future__ import annotations

import pytest

from affidavit import verify_events
from affidavit.verify import VerificationResult
from tests.verify.helpers import Log, rows, synthetic_log

Digest = tuple[str, str, str, str | None]


@pytest.fixture(scope="module")
def log() -> Log:
    return synthetic_log()


def ledger(log: Log) -> list[Digest]:
    """The ledger the log implies: one committed row per key, digests as the log records."""
    _, events = log
    found: dict[str, Digest] = {}
    for e in events:
        if e["type"] == "command_committed":
            p = e["payload"]
            found[p["idempotency_key"]] = (
                p["idempotency_key"],
                "committed",
                p["command_id"],
                p["result_hash"],
            )
    return list(found.values())


def verify(log: Log, digests: list[Digest]) -> VerificationResult:
    job_id, events = log
    stream = (
        {"version": v, "event_id": e, "type": t, "payload": p, "chain_hash": h}
        for v, e, t, p, h in rows(events)
    )
    return verify_events(stream, job_id=job_id, ledger_digests=digests)


def errors(log: Log, digests: list[Digest]) -> tuple[str, ...]:
    return verify(log, digests).tool_invocation_ledger_proof.errors


def test_the_implied_ledger_agrees(log: Log) -> None:
    result = verify(log, ledger(log))
    assert result.tool_invocation_ledger_proof.ok and result.replay_proof_result.ok


def test_each_disagreement_is_named(log: Log) -> None:
    rows_ = ledger(log)
    key, _, invocation, digest = rows_[0]
    short = key[:16] + "…"
    cases: list[tuple[list[Digest], str]] = [
        ([*rows_, rows_[0]], f"ledger row {short} appears twice"),
        ([(key, "committed", invocation, "0" * 64), *rows_[1:]], f"ledger row {short}: result"),
        ([(key, "started", invocation, None), *rows_[1:]], f"ledger row {short} is started"),
        ([(key, "failed", invocation, None), *rows_[1:]], f"ledger row {short} is failed"),
        ([(key, "lost", invocation, digest), *rows_[1:]], f"ledger row {short} has unknown"),
        ([*rows_, ("f" * 64, "committed", "x", None)], "ledger row ffffffffffffffff… has no"),
        (rows_[1:], f"key {short} was invoked but has no ledger row"),
        (
            [(key, "committed", "another-invocation", digest), *rows_[1:]],
            f"ledger row {short}: invocation_id not as in its tool_invocation_started event",
        ),
    ]
    for digests, message in cases:
        found = errors(log, digests)
        assert len(found) == 1 and found[0].startswith(message), (message, found)


def test_a_committed_row_without_a_commit_in_the_log(log: Log) -> None:
    """A row claiming a commit the log does not have is caught even when its result digest is
    missing too (``None`` must not pass for "no commit")."""
    job_id, events = log
    commits = [i for i, e in enumerate(events) if e["type"] == "command_committed"]
    uncommitted = (job_id, [e for i, e in enumerate(events) if i != commits[-1]])
    key, _, invocation, _ = ledger(log)[-1]
    found = errors(uncommitted, [*ledger(log)[:-1], (key, "committed", invocation, None)])
    assert found == (f"ledger row {key[:16]}… is committed but the log has no commit",)
