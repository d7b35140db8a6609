"""``affidavit.AsyncClient``: the same methods as ``Client``, each a coroutine (``stream`` an async
iterator), against a real server on loopback on both backends."""

from __future__ import annotations

import asyncio
import inspect
import tarfile
import threading
from pathlib import Path

import pytest

from affidavit import AsyncClient, Client, JobNotFound, SignalRejected, WaitTimeout
from affidavit.client import ApiError
from affidavit.tlog import LogKey, Sequencer, check_proof, default_log_key_path
from tests.api.conftest import Api
from tests.api.test_api import parked_in_flight
from tests.client.helpers import key
from tests.client.test_client import ONE_TOOL, SIGNAL_PLAN


def public(cls: type) -> list[str]:
    return sorted(n for n, _ in inspect.getmembers(cls, inspect.isfunction) if n[0] != "_")


def test_the_async_client_has_every_method_of_the_client() -> None:
    names = public(Client)
    assert public(AsyncClient) == names
    assert {"submit", "wait", "approve", "pack", "log_proof"} <= set(names)
    for name in names:
        sync, coro = getattr(Client, name), getattr(AsyncClient, name)
        # (stream is an iterator: an async generator on AsyncClient)
        assert inspect.iscoroutinefunction(coro) or (
            name == "stream" and inspect.isasyncgenfunction(coro)
        ), name
        assert list(inspect.signature(sync).parameters) == list(
            inspect.signature(coro).parameters
        ), name


def test_jobs_waits_and_decisions(api: Api) -> None:
    async def scenario() -> None:
        async with AsyncClient(api.url, api_key=key(api, "agent_a")) as c:
            job = await c.submit(ONE_TOOL, {"async": 1}, idempotency_key="async-1")
            assert (await c.submit(ONE_TOOL, {"async": 1}, idempotency_key="async-1")) == job
            assert (await c.get(job.job_id)).status == "pending"
            listed = await c.list(status="pending", limit=1000)
            assert job.job_id in {j.job_id for j in listed.jobs}
            with pytest.raises(WaitTimeout):
                await c.wait(job.job_id, timeout=0.2, poll_seconds=0.05)
            worker = threading.Thread(target=api.runtime.run_job, args=(job.job_id,))
            worker.start()
            try:
                done = await c.wait(job.job_id, timeout=120, poll_seconds=0.05)
            finally:
                worker.join()
            assert done.status == "completed"
            events = await c.events(job.job_id)
            assert [e.chain_hash for e in events] == [
                e.chain_hash for e in api.store.list_events(job.job_id)
            ]
            assert (await c.trace(job.job_id)).job.status == "completed"
            with pytest.raises(JobNotFound):
                await c.get("no-such-job")

            waiting = await c.submit(SIGNAL_PLAN, {})
            api.runtime.run_job(waiting.job_id)
            sent = await c.signal(waiting.job_id, f"{waiting.job_id}:w", {"go": True})
            assert sent.appended
            with pytest.raises(SignalRejected):
                await c.signal(waiting.job_id, "nope")

        async with AsyncClient(api.url, api_key=key(api, "approver_a")) as c:
            for decide, status in ((c.approve, "completed"), (c.deny, "failed")):
                job_id = api.waiting_job()
                assert (await c.decisions(job_id)).waits[0].may_decide
                await decide(job_id, f"{job_id}:ok", "by the async client")
                assert api.runtime.run_job(job_id).status == status

    asyncio.run(scenario())


def test_resume_and_cancel(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    parked = parked_in_flight(api, monkeypatch, None)
    pending = api.runtime.submit(ONE_TOOL, {"cancel": "async"}, namespace="a").job_id

    async def scenario() -> None:
        async with AsyncClient(api.url, api_key=key(api, "admin")) as c:
            assert (await c.resume(parked, "retry")).status == "pending"
            with pytest.raises(ApiError) as refused:
                await c.resume(parked, "retry")
            assert refused.value.code == "invalid_state"
            cancelled = await c.cancel(pending, reason="async")
            assert cancelled.cancel.state == "cancelled"

    asyncio.run(scenario())
    assert api.runtime.run_job(parked).status == "completed"
    assert api.store.get_job(pending).status == "cancelled"


def test_the_record(api: Api, tmp_path: Path) -> None:
    job_id = api.waiting_job()
    api.runtime.signal(job_id, f"{job_id}:ok", {"approved": True}, approver="ops")
    assert api.runtime.run_job(job_id).status == "completed"

    async def scenario() -> tuple[str, str]:
        async with AsyncClient(api.url, api_key=key(api, "observer_a")) as c:
            assert (await c.verify(job_id)).ok
            fresh = await c.verify(job_id, fresh=True)
            assert fresh.ok and fresh.cached is False
            path = await c.pack(job_id, tmp_path / "job.tar.gz")
            with tarfile.open(path) as archive:
                assert f"pack-{job_id}/pack_manifest.json" in archive.getnames()
            with pytest.raises(ApiError, match="job"):
                await c.pack(api.waiting_job(), tmp_path / "unfinished.tar.gz")
            assert not (tmp_path / "unfinished.tar.gz").exists()
            origin = Sequencer(api.store, log_key).integrate().origin
            return await c.log_proof(job_id), origin

    log_key = LogKey(default_log_key_path(api.store.url))
    proof, origin = asyncio.run(scenario())
    check = check_proof(proof, log_key.verifier(origin))
    assert check.ok, check.errors
