"""Event rows that no read of their job's log returns: on SQLite a job's log is one range of
the events table's rowid (``seq``), so a row put by hand at a ``seq`` outside its job's range —
in another job's range, or in none — is invisible to every reader of either job. `verify --all`
finds them in one pass over the table and fails the job they name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.verify.verification import misplaced_events
from tests.cli.test_cli import cli, json_of
from tests.verify.helpers import RawDb, refund_job


def test_verify_all_fails_the_job_of_a_row_outside_its_log(
    make_runtime: Callable[..., Runtime], raw: RawDb, tmp_path: Path
) -> None:
    rt = make_runtime()
    a = refund_job(rt, tmp_path / "a", "A-1001")
    b = refund_job(rt, tmp_path / "b", "A-1002")
    clean = cli("verify", "--all", "--db", raw.url, "--json")
    assert clean.returncode == 0 and json_of(clean)["failed"] == 0
    with rt.store.snapshot() as snap:
        assert misplaced_events(snap) == {}
    if not raw.url.startswith("sqlite:///"):
        pytest.skip("PostgreSQL reads a log by (job_id, version): no row of a job is outside it")

    [(number_b,)] = raw.rows("SELECT number FROM jobs WHERE job_id = ?", (b,))
    copy = (
        "INSERT INTO events (seq, job_id, version, event_id, type, payload, chain_hash) "
        "SELECT ?, job_id, ?, event_id || ?, type, payload, chain_hash FROM events "
        "WHERE job_id = ? AND version = 3"
    )
    raw.execute(copy, ((number_b << 32) + 500, 500, "x", a))  # in b's range
    raw.execute(copy, ((10_000 << 32) + 7, 7, "y", a))  # in no job's range
    for job_id in (a, b):  # each job's own log is as it was: invisible to them
        assert cli("verify", job_id, "--db", raw.url).returncode == 0

    every = cli("verify", "--all", "--db", raw.url, "--json")
    assert every.returncode == 1, every.stderr
    doc = json_of(every)
    assert doc["failed_jobs"] == [a] and doc["orphans"] == []
    [result] = [r for r in doc["results"] if r["job_id"] == a]
    error = result["replay_proof_result"]["error"]
    assert error.startswith(
        "position: the events table holds a row of this job that no read of its log returns: "
        f"version 500 at position {(number_b << 32) + 500}, in job {b}'s log (and 1 more)"
    )
    human = cli("verify", "--all", "--db", raw.url)
    assert human.returncode == 1 and a in human.stdout
    filtered = cli("verify", "--all", "--status", "completed", "--db", raw.url, "--json")
    assert json_of(filtered)["failed"] == 0  # a filter selects job rows: the table is not read
