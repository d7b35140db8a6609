"""The trace page of an agent job, in the real headless Chromium: its recorded calls in sequence
order (kind, tool, state, attempts, duration, waits) in place of a task graph."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import Api
from tests.api.test_ui import ARTIFACTS, browser, open_page  # noqa: F401 (browser: a fixture)
from tests.verify.agent_log import AgentLog, store_log


def test_trace_page_of_an_agent_job(browser: Any, api: Api) -> None:  # noqa: F811
    log = AgentLog().start(namespace="a")
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 150})
    log.pure("decide_refund", {"order": {"total": 150}}, {"amount": 150})
    log.sleep(1)
    log.wait("approval", "big_refund", None, answered=False)
    job_id = store_log(api.store, log, status="waiting")
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
    rows = page.locator("#agent-calls tr[data-seq]")
    assert rows.count() == 4
    assert [rows.nth(i).get_attribute("data-state") for i in range(4)] == [
        "side_effect_committed",
        "pure",
        "pure",
        "waiting",
    ]
    assert "lookup_order" in rows.nth(0).inner_text()
    assert "timer" in rows.nth(2).inner_text() and "answered by timer" in rows.nth(2).inner_text()
    assert "approval big_refund (open)" in rows.nth(3).inner_text()
    assert "Task graph" not in page.inner_text("#content")
    assert page.locator("[data-wait='#3']").count() == 1  # the signal to send, as for plans
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"trace-agent-{api.store.backend}.png"), full_page=True)
    page.close()
