"""Records of a job whose job row is gone — its events, ledger rows or seal left behind when the
row was deleted outside the store — are reported as failing, never skipped, on both backends."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from affidavit import Runtime, verify_job
from affidavit.core.errors import JobNotFound
from affidavit.examples import refund
from affidavit.verify import verify_orphans
from tests.cli.test_cli import cli, json_of
from tests.verify.helpers import SECTION6_KEYS, RawDb, refund_job

Refunded = tuple[Runtime, str]
SECTION6 = set(SECTION6_KEYS)


def test_a_sound_database_has_no_orphans(refunded: Refunded) -> None:
    rt, _ = refunded
    assert verify_orphans(rt.store) == []


def test_a_deleted_job_row_leaves_a_failing_orphan(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    before = verify_job(rt.store, job_id)
    assert before.ok
    raw.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
    with pytest.raises(JobNotFound):  # verify_job verifies jobs; orphans are found apart
        verify_job(rt.store, job_id)

    (result,) = verify_orphans(rt.store)
    assert result.job_id == job_id and result.orphan and result.status is None
    assert not result.ok
    json.dumps(result.to_dict())
    assert set(result.to_dict()) == SECTION6
    replay = result.replay_proof_result
    assert replay.invariant == "status" and replay.version is None
    assert "no job row" in replay.error
    assert "events" in replay.error and "ledger rows" in replay.error and "seal" in replay.error
    # the log left behind is still checked: it is the log that was sealed
    assert result.event_chain_root_hash == before.event_chain_root_hash
    assert result.execution_hash == before.execution_hash
    assert result.stored_chain == before.stored_chain
    assert result.seal.ok and result.tool_invocation_ledger_proof.ok
    assert verify_orphans(rt.store, job_id=job_id) == [result]
    assert verify_orphans(rt.store, job_id="no-such-job") == []
    assert verify_orphans(rt.store, job_id="bad\x00id") == []


def test_every_table_left_behind_is_found(
    make_runtime: Callable[..., Runtime], tmp_path: Path, raw: RawDb
) -> None:
    """Three jobs: one keeps only its ledger rows and seal, one only its seal, one only its
    events; a fourth stays whole. Each orphan is found once, in job id order, with its own log."""
    rt = make_runtime()
    jobs = [refund_job(rt, tmp_path / f"shop-{n}") for n in range(4)]
    ledger_and_seal, seal_only, events_only, whole = jobs
    counts = {j: len(raw.events(j)) for j in jobs}
    for job_id in (ledger_and_seal, seal_only, events_only):
        raw.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
    raw.execute("DELETE FROM events WHERE job_id IN (?, ?)", (ledger_and_seal, seal_only))
    raw.execute("DELETE FROM tool_invocations WHERE job_id IN (?, ?)", (seal_only, events_only))
    raw.execute("DELETE FROM seals WHERE job_id = ?", (events_only,))

    results = verify_orphans(rt.store)
    by_id = {r.job_id: r for r in results}
    assert sorted(by_id) == sorted((ledger_and_seal, seal_only, events_only))
    assert [r.job_id for r in results] == sorted(by_id)
    assert not any(r.ok for r in results) and all(r.orphan for r in results)
    reasons = {j: by_id[j].replay_proof_result.error for j in by_id}
    assert "ledger rows and a seal" in reasons[ledger_and_seal]
    assert "events" not in reasons[ledger_and_seal]
    assert "a seal" in reasons[seal_only] and "ledger" not in reasons[seal_only]
    assert "events" in reasons[events_only] and "seal" not in reasons[events_only]
    # each orphan's own records, not another's
    assert by_id[events_only].stored_chain.event_count == counts[events_only]
    assert by_id[events_only].stored_chain.ok
    assert not by_id[events_only].seal.ok  # its log is terminal and its seal is gone
    assert by_id[seal_only].stored_chain.event_count == 0
    assert not by_id[seal_only].seal.ok  # a seal over a log that is not there
    assert not by_id[ledger_and_seal].tool_invocation_ledger_proof.ok
    assert verify_job(rt.store, whole).ok


def test_verify_all_and_verify_report_an_orphan(store_url: str, tmp_path: Path) -> None:
    with Runtime(store_url, tools=refund.TOOLS) as rt:
        kept = refund_job(rt, tmp_path / "shop-1")
        gone = refund_job(rt, tmp_path / "shop-2")
    raw = RawDb(store_url)
    assert cli("verify", "--all", "--db", store_url).returncode == 0
    raw.execute("DELETE FROM jobs WHERE job_id = ?", (gone,))
    listed = cli("jobs", "list", "--db", store_url, "--json")
    assert [j["job_id"] for j in json_of(listed)] == [kept]

    every = cli("verify", "--all", "--db", store_url, "--json")
    assert every.returncode == 1, every.stderr
    doc = json_of(every)
    assert (doc["jobs"], doc["verified"], doc["failed"]) == (2, 1, 1)
    assert doc["failed_jobs"] == [gone] and doc["orphans"] == [gone]
    assert [r["job_id"] for r in doc["results"]] == [kept, gone]  # orphans after the jobs
    orphan = doc["results"][1]
    assert set(orphan) == SECTION6 and orphan["ok"] is False
    assert "no job row" in orphan["replay_proof_result"]["error"]
    with Runtime(store_url) as rt:
        assert orphan == verify_orphans(rt.store)[0].to_dict()

    human = cli("verify", "--all", "--db", store_url)
    assert human.returncode == 1 and "Traceback" not in human.stderr
    assert gone in human.stdout and "no job row" in human.stdout
    assert "NOT verified: 1 of 2 jobs failed a check" in human.stdout

    # a filter selects jobs by their row: an orphan has none, and is not looked for
    narrowed = cli("verify", "--all", "--status", "completed", "--db", store_url, "--json")
    assert narrowed.returncode == 0, narrowed.stdout
    assert json_of(narrowed)["orphans"] == []

    one = cli("verify", gone, "--db", store_url, "--json")
    assert one.returncode == 1, one.stderr
    assert json_of(one) == orphan
    one_human = cli("verify", gone, "--db", store_url)
    assert one_human.returncode == 1
    assert "no job row" in one_human.stdout and "NOT verified" in one_human.stdout
    # an id nothing in the database holds is still "not found"
    assert cli("verify", "no-such-job", "--db", store_url, "--json").returncode == 2
