"""What a new user reads first on the trace page, in the real headless Chromium against the
real API server: the login hint names a role that can approve; the header shows the job's
input (cut when long); an unfinished job's seal badge says "not sealed yet"; a running tool
call is `running`; an answered approval is `approved` or `denied`; an agent's approval is
shown by its key; a step a later attempt recovered says so, with the dead attempt's worker."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import affidavit.core.crash as crash_module
from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from tests.api.conftest import WAITING_PLAN, Api
from tests.api.test_ui import ARTIFACTS, browser, open_page  # noqa: F401 (browser: a fixture)
from tests.runtime.helpers import SimulatedCrash, wait_lease_expired
from tests.verify.agent_log import AgentLog, store_log


def test_the_login_hint_names_a_role_that_can_approve(browser: Any, api: Api) -> None:  # noqa: F811
    page = browser.new_page()
    page.goto(api.url + "/ui/")
    hint = page.inner_text("#login .hint")
    assert "--role approver" in hint and "decide approvals" in hint, hint
    page.close()


def test_the_header_shows_the_input_and_an_unfinished_job_is_not_sealed_yet(
    browser: Any,  # noqa: F811
    api: Api,
) -> None:
    job_id = api.waiting_job("a")
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
    assert page.inner_text("#job-input code") == '{"x":1}'
    seal = page.locator("#proofs [data-proof=seal]")
    assert seal.inner_text() == "not sealed yet" and seal.get_attribute("data-ok") == "pending"
    page.close()
    api.runtime.signal(job_id, f"{job_id}:ok", {"approved": True}, approver="ann")
    api.runtime.run_job(job_id)
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
    assert page.locator("#proofs [data-proof=seal]").inner_text() == "seal OK"
    page.close()

    long_input = {"x": 1, "note": "n" * 5000}
    job = api.runtime.submit(WAITING_PLAN, long_input, namespace="a")
    page = open_page(browser, api, f"/ui/jobs/{job.job_id}", "observer_a")
    shown = page.locator("#job-input code")
    assert shown.get_attribute("data-cut") == "true"
    assert len(shown.inner_text()) == 201 and shown.inner_text().endswith("…")
    assert "characters" in page.inner_text("#job-input")
    page.close()


@pytest.mark.parametrize("approved", [True, False])
def test_an_answered_approval_is_drawn_approved_or_denied(
    browser: Any,  # noqa: F811
    api: Api,
    approved: bool,
) -> None:
    job_id = api.waiting_job("a")
    api.runtime.signal(job_id, f"{job_id}:ok", {"approved": approved}, approver="ann")
    api.runtime.run_job(job_id)
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
    state = "approved" if approved else "denied"
    assert page.get_attribute("#dag g.node[data-node=ok]", "data-state") == state
    assert state in page.inner_text("#nodes tr[data-node=ok]")
    page.close()


def test_an_agent_approval_is_shown_by_its_key(browser: Any, api: Api) -> None:  # noqa: F811
    log = AgentLog().start(namespace="a")
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 150})
    log.wait("approval", "big_refund", None, answered=False)
    job_id = store_log(api.store, log, status="waiting")
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "approver_a")
    row = page.locator("#agent-calls tr[data-seq='1'] td.step-name")
    assert row.inner_text() == "big_refund (step #1)"
    assert page.inner_text("#nodes tr[data-node='#1'] td:first-child") == "big_refund (step #1)"
    assert page.inner_text("[data-wait='#1']").startswith("Waiting on big_refund (step #1):")
    assert page.inner_text("#decide .wait-decision h3") == "Approval “big_refund (step #1)”"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"agent-key-{api.store.backend}.png"), full_page=True)
    page.close()


def test_a_running_tool_call_is_running_not_in_flight(browser: Any, api: Api) -> None:  # noqa: F811
    entered, release = threading.Event(), threading.Event()

    def slow(ctx: ToolContext) -> dict[str, Any]:
        entered.set()
        assert release.wait(60)
        return {}

    graph = {"name": "slow", "nodes": [{"id": "s", "type": "tool", "tool": "slow"}]}
    with Runtime(api.store.url, tools=ToolRegistry([Tool("slow", slow, "tool")])) as rt:
        job_id = rt.submit(graph, {}, namespace="a").job_id
        runner = threading.Thread(target=rt.run_job, args=(job_id,))
        runner.start()
        try:
            assert entered.wait(60)
            page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
            assert page.get_attribute("#dag g.node[data-node=s]", "data-state") == "running"
            assert "running" in page.inner_text("#nodes tr[data-node=s]")
            page.close()
        finally:
            release.set()
            runner.join(60)


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    def arm(point: str) -> None:
        armed = [True]

        def crash_point(name: str) -> None:
            if name == point and armed[0]:
                armed[0] = False
                raise SimulatedCrash(name)

        monkeypatch.setattr(crash_module, "crash_point", crash_point)

    return arm


def test_a_recovered_step_says_how_with_the_dead_attempts_worker(
    browser: Any,  # noqa: F811
    api: Api,
    crash_at: Callable[[str], None],
) -> None:
    effects: dict[str, Any] = {}

    def pay(ctx: ToolContext) -> dict[str, Any]:
        effects[ctx.external_key] = {"paid": 1}
        return effects[ctx.external_key]

    tool = Tool("pay", pay, "tool", reconcile_fn=lambda ctx: effects.get(ctx.external_key))
    graph = {"name": "pay", "nodes": [{"id": "p", "type": "tool", "tool": "pay"}]}
    with Runtime(api.store.url, tools=ToolRegistry([tool]), lease_seconds=0.4) as rt:
        job_id = rt.submit(graph, {}, namespace="a").job_id
        crash_at("tool.after_execute")
        with pytest.raises(SimulatedCrash):
            rt.run_until_idle()
        dead = rt.worker.worker_id
        wait_lease_expired(rt.store, job_id)
        rt.worker.worker_id = "worker-two"
        rt.run_job(job_id)
        assert rt.get_job(job_id).status == "completed" and len(effects) == 1
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
    cell = page.locator("#nodes tr[data-node=p] td.recovered")
    assert cell.get_attribute("data-recovered") == "1"
    assert cell.inner_text().startswith(f"caught up by reconcile: attempt 1 (worker {dead})")
    page.close()
