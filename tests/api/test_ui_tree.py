"""The trace page of a job tree, in the real headless Chromium: a parent lists its child jobs
with their status, each a link to the child's page, and a child links back to its parent."""

from __future__ import annotations

from typing import Any

from affidavit.store import JobFilter
from tests.api.conftest import Api
from tests.api.test_children_api import child_api  # noqa: F401 (a fixture)
from tests.api.test_ui import ARTIFACTS, browser, open_page  # noqa: F401 (browser: a fixture)


def test_the_tree_both_ways(browser: Any, child_api: Api) -> None:  # noqa: F811
    with child_api.client("agent_a") as c:
        r = c.post("/api/jobs", json={"agent": "ch_parent", "input": {"orders": ["A", "BAD-1"]}})
        assert r.status_code == 201, r.text
        root = r.json()["job_id"]
    child_api.runtime.run_until_idle()
    children = child_api.store.get_job(root).output
    ids = [c["job_id"] for c in children]
    page = open_page(browser, child_api, f"/ui/jobs/{root}", "observer_a")
    assert page.locator("#parent-job").count() == 0  # the root has no parent
    rows = page.locator("#children tr[data-child]")
    assert [rows.nth(i).get_attribute("data-child") for i in range(rows.count())] == ids
    assert [rows.nth(i).get_attribute("data-status") for i in range(2)] == ["completed", "failed"]
    assert "failed" in rows.nth(1).inner_text()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"trace-tree-{child_api.store.backend}.png"))
    rows.nth(1).locator("a").click()  # down to the failed child's page
    page.wait_for_url(f"**/ui/jobs/{ids[1]}")
    page.wait_for_selector("body[data-ready]")
    assert page.inner_text("#job-status") == "failed"
    assert page.locator("#children").count() == 0  # a leaf lists no children
    link = page.locator("#parent-job a")
    assert link.inner_text() == root
    link.click()  # and back up to the parent
    page.wait_for_url(f"**/ui/jobs/{root}")
    page.wait_for_selector("#children tr[data-child]")
    assert page.inner_text("#job-status") == "completed"
    page.close()


def test_a_waiting_parents_page_shows_its_children_as_they_end(
    browser: Any,  # noqa: F811
    child_api: Api,  # noqa: F811
) -> None:
    """The parent records nothing while it waits: its page still shows a child that ends
    meanwhile, without a reload."""
    with child_api.client("agent_a") as c:
        r = c.post("/api/jobs", json={"agent": "ch_parent", "input": {"orders": ["WAIT-1", "A"]}})
        assert r.status_code == 201, r.text
        root = r.json()["job_id"]
    child_api.runtime.run_until_idle()
    assert child_api.store.get_job(root).status == "waiting"
    first = child_api.store.list_jobs(JobFilter(parent=root, status=["waiting"]))[0].job_id
    page = open_page(browser, child_api, f"/ui/jobs/{root}", "observer_a")
    assert page.get_attribute(f'#children tr[data-child="{first}"]', "data-status") == "waiting"
    child_api.runtime.signal(first, "go-WAIT-1", None)
    assert child_api.runtime.run_job(first).status == "completed"
    assert child_api.store.get_job(root).status == "pending"  # (woken, not run: no new event)
    page.wait_for_selector(f'#children tr[data-child="{first}"][data-status="completed"]')
    assert page.inner_text("#job-status") == "pending"
    page.close()
