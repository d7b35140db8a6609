"""``affidavit.Client`` against a real server on loopback, on both backends: one test per
method, each checked against what the store recorded."""

from __future__ import annotations

import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from affidavit import (
    ConfigError,
    JobNotFound,
    Plan,
    SignalRejected,
    WaitTimeout,
)
from affidavit.api.models import CancelResult, Event, Job, JobList, SignalResult, Verification
from affidavit.client import ApiError
from affidavit.tlog import LogKey, Sequencer, check_proof, default_log_key_path
from tests.api.conftest import WAITING_PLAN, Api
from tests.api.test_api import parked_in_flight
from tests.client.helpers import client

SIGNAL_PLAN: dict[str, Any] = {
    "name": "client-signal",
    "nodes": [
        {"id": "w", "type": "wait"},
        {"id": "t", "type": "pure", "tool": "think", "args": {"w": "${w}"}, "depends_on": ["w"]},
    ],
}
ONE_TOOL: dict[str, Any] = {"nodes": [{"id": "a", "type": "tool", "tool": "act"}]}


def approved_and_finished(api: Api) -> str:
    """A job of namespace a, approved over the client and run to completion."""
    job_id = api.waiting_job()
    with client(api, "approver_a") as c:
        c.approve(job_id, f"{job_id}:ok")
    assert api.runtime.run_job(job_id).status == "completed"
    return job_id


def test_submit(api: Api, tmp_path: Path) -> None:
    with client(api, "agent_a") as c:
        job = c.submit(WAITING_PLAN, {"x": 1}, idempotency_key="client-submit")
        assert isinstance(job, Job)
        assert (job.status, job.namespace, job.submitted_by) == ("pending", "a", "bot-a")
        assert c.submit(WAITING_PLAN, {"x": 1}, idempotency_key="client-submit") == job
        stored = api.store.get_job(job.job_id)
        assert (stored.plan_name, stored.idempotency_key) == ("api-test", "client-submit")
        # a plan file (read here) and a Plan object are the same plan
        plan_file = tmp_path / "plan.yaml"
        plan_file.write_text("name: from-file\nnodes:\n  - {id: a, type: tool, tool: act}\n")
        from_file = c.submit(plan_file, {})
        from_str = c.submit(str(plan_file), {})
        from_plan = c.submit(Plan.from_file(plan_file), {})
        hashes = {c.trace(j.job_id).plan_hash for j in (from_file, from_str, from_plan)}
        assert len(hashes) == 1 and from_plan.plan_name == "from-file"
        with pytest.raises(ConfigError, match="cannot submit a int"):
            c.submit(7, {})
        # the placement fields reach the server: an undeclared queue is refused there
        with pytest.raises(ConfigError, match="no-such-queue"):
            c.submit(ONE_TOOL, {}, queue="no-such-queue", priority=1, partition_key="k")


def test_get(api: Api) -> None:
    job_id = approved_and_finished(api)
    with client(api, "observer_a") as c:
        job = c.get(job_id)
    stored = api.store.get_job(job_id)
    assert (job.status, job.output) == ("completed", stored.output)
    assert job.event_count == stored.version
    assert job.head_hash == stored.head_hash


def test_list(api: Api) -> None:
    with client(api, "agent_a") as c:
        made = [c.submit(ONE_TOOL, {"n": n}).job_id for n in range(3)]
        first = c.list(status="pending", limit=2)
        assert isinstance(first, JobList) and len(first.jobs) == 2
        assert first.next_before == first.jobs[-1].job_id
        rest = c.list(status=["pending"], limit=1000, before=first.next_before)
        listed = [j.job_id for j in first.jobs + rest.jobs]
        assert set(made) <= set(listed) and len(listed) == len(set(listed))
        assert {j.namespace for j in first.jobs + rest.jobs} == {"a"}
        assert c.list(status="failed", limit=1000).jobs == [
            j for j in c.list(limit=1000).jobs if j.status == "failed"
        ]


def test_wait_returns_a_finished_job(api: Api) -> None:
    with client(api, "agent_a") as c:
        job = c.submit(ONE_TOOL, {"wait": "finished"})
        worker = threading.Thread(target=api.runtime.run_job, args=(job.job_id,))
        worker.start()
        try:
            done = c.wait(job.job_id, timeout=120, poll_seconds=0.05)
        finally:
            worker.join()
    assert done.status == "completed"
    assert done.output == api.store.get_job(job.job_id).output


def test_wait_returns_a_job_that_needs_a_person(api: Api) -> None:
    job_id = api.waiting_job()
    with client(api, "observer_a") as c:
        assert c.wait(job_id, timeout=60).status == "waiting"


def test_wait_times_out_on_a_job_no_worker_runs(api: Api) -> None:
    with client(api, "agent_a") as c:
        job = c.submit(ONE_TOOL, {"wait": "forever"})
        with pytest.raises(WaitTimeout) as caught:
            c.wait(job.job_id, timeout=0.3, poll_seconds=0.05)
    assert caught.value.job.job_id == job.job_id and caught.value.job.status == "pending"
    assert "still pending after 0.3 s" in caught.value.message
    assert api.store.get_job(job.job_id).status == "pending"  # (waiting changed nothing)


def test_wait_for_an_unknown_job(api: Api) -> None:
    with client(api, "observer_a") as c, pytest.raises(JobNotFound):
        c.wait("no-such-job", timeout=5)


def test_signal(api: Api) -> None:
    with client(api, "agent_a") as c:
        job = c.submit(SIGNAL_PLAN, {})
        assert api.runtime.run_job(job.job_id).status == "waiting"
        sent = c.signal(job.job_id, f"{job.job_id}:w", {"answer": 42})
        assert isinstance(sent, SignalResult) and sent.appended and sent.status == "pending"
        assert c.signal(job.job_id, f"{job.job_id}:w", {"answer": 42}).appended is False
        with pytest.raises(SignalRejected, match="no wait with correlation key"):
            c.signal(job.job_id, "nope", {})
    done = api.runtime.run_job(job.job_id)
    assert done.status == "completed" and done.output["t"]["thought"]["w"] == {"answer": 42}


def test_approve(api: Api) -> None:
    job_id = api.waiting_job()
    with client(api, "approver_a") as c:
        sent = c.approve(job_id, f"{job_id}:ok", comment="looks right")
    assert sent.appended and sent.status == "pending"
    [done] = [e.payload for e in api.store.list_events(job_id) if e.type == "wait_completed"]
    [decision] = done["decided_by"]
    assert (decision["principal"], decision["role"]) == ("ann", "approver")
    assert done["payload"] == {"approved": True, "comment": "looks right"}
    assert api.runtime.run_job(job_id).status == "completed"


def test_deny(api: Api) -> None:
    job_id = api.waiting_job()
    with client(api, "approver_a") as c:
        c.deny(job_id, f"{job_id}:ok", comment="no")
    failed = api.runtime.run_job(job_id)
    assert failed.status == "failed"
    [done] = [e.payload for e in api.store.list_events(job_id) if e.type == "wait_completed"]
    assert done["payload"] == {"approved": False, "comment": "no"}


def test_resume(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = parked_in_flight(api, monkeypatch, None)
    with client(api, "admin") as c:
        park = c.trace(job_id).parked
        assert park is not None
        with pytest.raises(ApiError) as refused:
            c.resume(job_id, "retry", park_version=park["version"] + 1)
        assert (refused.value.code, refused.value.status) == ("invalid_state", 409)
        resumed = c.resume(job_id, "retry", park_version=park["version"], note="checked")
    assert resumed.status == "pending"
    assert api.runtime.run_job(job_id).status == "completed"


def test_cancel(api: Api) -> None:
    with client(api, "agent_a") as c:
        job = c.submit(ONE_TOOL, {"cancel": True})
    with client(api, "admin") as c:
        done = c.cancel(job.job_id, reason="not needed")
    assert isinstance(done, CancelResult)
    assert (done.status, done.cancel.state) == ("cancelled", "cancelled")
    assert api.store.get_job(job.job_id).status == "cancelled"


def test_events(api: Api) -> None:
    job_id = approved_and_finished(api)
    stored = api.store.list_events(job_id)
    with client(api, "observer_a") as c:
        events = c.events(job_id)
        later = c.events(job_id, after_version=2)
    assert all(isinstance(e, Event) for e in events)
    assert [(e.version, e.type, e.chain_hash) for e in events] == [
        (e.version, e.type, e.chain_hash) for e in stored
    ]
    assert [e.version for e in later] == [e.version for e in stored][2:]


def test_events_of_more_than_one_page(api: Api) -> None:
    """A job whose log is longer than the API's largest page (1,000 events)."""
    nodes = [{"id": f"n{i}", "type": "pure", "tool": "think"} for i in range(600)]
    with client(api, "agent_a") as c:
        job = c.submit({"nodes": nodes}, {})
        assert api.runtime.run_job(job.job_id).status == "completed"
        events = c.events(job.job_id)
    assert [e.version for e in events] == list(range(1, api.store.get_job(job.job_id).version + 1))
    assert len(events) > 1000


def test_verify(api: Api) -> None:
    job_id = approved_and_finished(api)
    with client(api, "observer_a") as c:
        result = c.verify(job_id)
        with pytest.raises(ConfigError):  # (422 config_error: the pin reached the server)
            c.verify(job_id, trusted_keys=["not-a-key"])
    assert isinstance(result, Verification) and result.ok and result.seal.ok
    assert result.stored_chain.event_count == api.store.get_job(job_id).version


def test_verify_fresh(api: Api) -> None:
    """A sealed job's verdict is kept by the server (``cached``, ``computed_at``); ``fresh``
    verifies the database as it is now."""
    job_id = approved_and_finished(api)
    with client(api, "observer_a") as c:
        first, kept, fresh = c.verify(job_id), c.verify(job_id), c.verify(job_id, fresh=True)
    assert (first.cached, kept.cached, fresh.cached) == (False, True, False)
    assert kept.computed_at == first.computed_at and fresh.computed_at
    assert fresh.computed_at > first.computed_at and fresh.ok


def test_pack(api: Api, tmp_path: Path) -> None:
    job_id = approved_and_finished(api)
    with client(api, "observer_a") as c:
        path = c.pack(job_id, tmp_path)
        assert path == tmp_path / f"pack-{job_id}.tar.gz"
        with tarfile.open(path) as archive:
            names = archive.getnames()
        assert f"pack-{job_id}/pack_manifest.json" in names
        with pytest.raises(ConfigError, match="exists already"):
            c.pack(job_id, path)
        unfinished = api.waiting_job()
        with pytest.raises(ApiError) as refused:
            c.pack(unfinished, tmp_path / "unfinished.tar.gz")
    assert (refused.value.code, refused.value.status) == ("job_not_finished", 409)
    assert not (tmp_path / "unfinished.tar.gz").exists()


def test_log_proof(api: Api) -> None:
    job_id = approved_and_finished(api)
    with client(api, "observer_a") as c:
        with pytest.raises(ApiError) as queued:
            c.log_proof(job_id)
        assert (queued.value.code, queued.value.status) == ("not_in_log", 404)
        log_key = LogKey(default_log_key_path(api.store.url))
        done = Sequencer(api.store, log_key).integrate()
        proof = c.log_proof(job_id)
    assert proof.startswith("c2sp.org/tlog-proof@v1\n")
    check = check_proof(proof, log_key.verifier(done.origin))
    assert check.ok, check.errors
    assert check.leaf is not None and check.leaf["job_id"] == job_id
