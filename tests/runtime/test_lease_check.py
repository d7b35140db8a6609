"""A run that learns it lost its lease after T1 committed does not act."""

from __future__ import annotations

import threading

import pytest

from affidavit import Runtime, ToolRegistry, tool
from affidavit.core import crash as crash_module
from affidavit.runtime._runner import JobRunner
from affidavit.runtime._worker import Worker

calls: list[str] = []


@tool("lease_check_charge")
def charge(ctx, amount: int) -> dict[str, int]:  # type: ignore[no-untyped-def]
    calls.append(ctx.external_key)
    return {"amount": amount}


def test_lease_lost_between_t1_and_execute_does_not_act(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls.clear()
    registry = ToolRegistry([charge])
    plan = {"nodes": [{"id": "pay", "type": "tool", "tool": "lease_check_charge",
                       "args": {"amount": 5}}]}  # fmt: skip
    lost = threading.Event()

    def after_acquire(name: str) -> None:
        if name == "tool.after_acquire":
            lost.set()  # as the heartbeat would, on finding the lease taken over

    monkeypatch.setattr(crash_module, "crash_point", after_acquire)
    with Runtime(store_url, tools=registry) as rt:
        job = rt.submit(plan)
        claim = Worker(rt.store, registry).claim(job.job_id)
        assert claim is not None
        status = JobRunner(rt.store, registry, lease_lost=lost).run(claim)
        assert status == "lost"
        assert calls == []  # the tool was not called
        types = [e.type for e in rt.store.list_events(job.job_id)]
        assert types[-1] == "tool_invocation_started"  # left open for the next owner
