"""A claim loop's next claim, made as its current job's end is written (on PostgreSQL it travels
in that transaction's message; on SQLite the loop claims after the end): what it claims is what
a claim made at that moment would claim. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.runtime._worker import Worker
from tests.runtime.helpers import node, plan


def test_a_job_another_loop_found_unrunnable_meanwhile_is_not_claimed_again(
    store_url: str,
) -> None:
    """While loop 1 runs job A, loop 2 claims job B, which needs a tool this worker lacks, and
    hands it back. The claim A's end makes skips B, as loop 2's next claim does: B is claimed
    once, not again."""
    b_handed_back = threading.Event()

    def gate(ctx: ToolContext) -> dict[str, Any]:
        assert b_handed_back.wait(20), "job B was never handed back"
        return {"ok": True}

    gated = Tool("gate", gate, "tool")
    absent = Tool("absent", lambda ctx: {"ok": True}, "tool")
    with Runtime(store_url, tools=ToolRegistry([gated, absent])) as rt:
        a = rt.submit(plan(node("a", "gate")), {}).job_id
        b = rt.submit(plan(node("b", "absent")), {}).job_id
        ended: list[tuple[str, str]] = []

        def on_job(job: str, status: str, seconds: float) -> None:
            ended.append((job, status))
            if job == b:
                b_handed_back.set()

        worker = Worker(rt.store, ToolRegistry([gated]), on_job=on_job)
        assert worker.run(until_idle=True, concurrency=2) == 1
        assert sorted(ended) == sorted([(a, "completed"), (b, "unrunnable")])
        job = rt.get_job(b)
        assert (job.status, job.lease_owner) == ("pending", None)


def test_a_loop_told_to_stop_during_a_job_claims_nothing_with_its_end(store_url: str) -> None:
    """``Worker.run(stop=...)`` set while a job runs: the job finishes, and its end carries no
    claim — the next job is never taken (no attempt id), not taken and handed back."""
    stop = threading.Event()

    def stopping(ctx: ToolContext) -> dict[str, Any]:
        stop.set()
        return {"ok": True}

    tools = ToolRegistry([Tool("stopping", stopping, "tool")])
    with Runtime(store_url, tools=tools) as rt:
        first = rt.submit(plan(node("a", "stopping")), {}).job_id
        second = rt.submit(plan(node("a", "stopping")), {}).job_id
        assert Worker(rt.store, tools).run(stop=stop) == 1
        assert rt.get_job(first).status == "completed"
        job = rt.get_job(second)
        assert (job.status, job.attempt_id, job.lease_owner) == ("pending", None, None)
