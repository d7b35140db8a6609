"""Queues through the Runtime: declared in code, submitted into, run by its worker; a job that
waits gives its slot up and takes one again when resumed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import affidavit
from affidavit import Runtime, Tool, ToolRegistry
from affidavit.core.errors import ConfigError
from affidavit.runtime import _queues as runtime_queues
from affidavit.store.queue_grants import job_queue_claims
from affidavit.store.queues import get_queue, queue_config, recorded_grants, set_queue
from affidavit.verify.queue_limits import verify_queue

ACT = Tool("act", lambda ctx, x: {"x": x}, "tool")
WAITS = {
    "name": "waits",
    "nodes": [
        {"id": "a", "type": "tool", "tool": "act", "args": {"x": "${input.x}"}},
        {"id": "w", "type": "wait", "depends_on": ["a"]},
    ],
}
ONE = {"name": "one", "nodes": [{"id": "a", "type": "tool", "tool": "act", "args": {"x": 1}}]}


@pytest.fixture(autouse=True)
def _no_declarations() -> Iterator[None]:
    runtime_queues._declared.clear()
    yield
    runtime_queues._declared.clear()


def test_declared_queue_is_written_and_a_conflict_refused(store_url: str) -> None:
    config = affidavit.queue("rt-llm", concurrency=3, rate="10/1s")
    with Runtime(store_url, tools=ToolRegistry([ACT])) as rt:
        assert get_queue(rt.store, "rt-llm") == config
        set_queue(rt.store, queue_config("rt-llm", concurrency=5))  # changed by an operator
    with pytest.raises(ConfigError, match="configured otherwise"):
        Runtime(store_url, tools=ToolRegistry([ACT]))
    with pytest.raises(ConfigError, match="declared twice"):
        affidavit.queue("rt-llm", concurrency=4)


def test_submit_checks_the_queue(store_url: str) -> None:
    with Runtime(store_url, tools=ToolRegistry([ACT])) as rt:
        with pytest.raises(ConfigError, match="no queue"):
            rt.submit(ONE, queue="missing")
        with pytest.raises(ConfigError, match="need a queue"):
            rt.submit(ONE, priority=1)
        assert rt.store.list_jobs() == []


def test_a_waiting_job_frees_its_slot_and_takes_one_when_resumed(store_url: str) -> None:
    affidavit.queue("rt-one", concurrency=1)
    with Runtime(store_url, tools=ToolRegistry([ACT])) as rt:
        first = rt.submit(WAITS, {"x": 1}, queue="rt-one").job_id
        second = rt.submit(ONE, queue="rt-one").job_id
        default = rt.submit(ONE).job_id  # the default queue, claimed as ever
        rt.run_until_idle()
        assert rt.get_job(first).status == "waiting"
        assert rt.get_job(second).status == "completed"  # ran while the first waited
        assert rt.get_job(default).status == "completed"
        rt.signal(first, f"{first}:w", {"ok": True})
        rt.run_until_idle()
        assert rt.get_job(first).status == "completed"
        grants = [
            (g["job_id"], g["started"], g["slot"]) for g in recorded_grants(rt.store, "rt-one", 0)
        ]
        assert grants == [(first, True, 0), (second, True, 0), (first, False, 0)]
        assert all(affidavit.verify_job(rt.store, j).ok for j in (first, second, default))
        # the runtime's own writes record each hold's end: the wait, then the completion
        now = time.time()
        ended = [c["ended_as"] for c in job_queue_claims(rt.store, first, now)]
        assert ended == ["waiting", "completed"]
        assert [c["ended_as"] for c in job_queue_claims(rt.store, second, now)] == ["completed"]
        assert job_queue_claims(rt.store, default, now) == []
        proof = verify_queue(rt.store, "rt-one", 0.0, now)
        assert proof.ok and proof.concurrency is not None and proof.concurrency.worst == 1


def test_a_worker_of_other_queues_leaves_the_default_one(store_url: str) -> None:
    affidavit.queue("rt-only")
    with Runtime(store_url, tools=ToolRegistry([ACT]), queues=["rt-only"]) as rt:
        default = rt.submit(ONE).job_id
        queued = rt.submit(ONE, queue="rt-only").job_id
        rt.run_until_idle()
        assert rt.get_job(default).status == "pending"
        assert rt.get_job(queued).status == "completed"
