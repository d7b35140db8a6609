"""The trace page in a real headless Chromium (Debian's ``/usr/bin/chromium``, driven by
Playwright), against the real API server on loopback. Screenshots go to ``test-artifacts/``
(or ``$AFFIDAVIT_TEST_ARTIFACTS``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit import FileVerifier, Runtime, Tool, ToolContext, ToolRegistry, record_file
from tests.api.conftest import Api
from tests.verify.helpers import RawDb

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency")

ARTIFACTS = Path(os.environ.get("AFFIDAVIT_TEST_ARTIFACTS", "test-artifacts"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser: Any, api: Api, path: str, who: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(api.url + path)
    page.fill("#key", api.keys[who].removeprefix("Bearer "))
    page.click("#login button[type=submit]")
    page.wait_for_selector("body[data-ready]")
    assert page.get_attribute("body", "data-ready") == "true", page.inner_text("#error")
    return page


def parked_job(api: Api, tmp_path: Path) -> str:
    """A job parked because the file its first step wrote was edited while it waited."""
    report = tmp_path / "report.txt"

    def write(ctx: ToolContext) -> dict[str, Any]:
        report.write_text("refund approved\n")
        record_file(ctx, report)
        return {"path": str(report)}

    def after(ctx: ToolContext, w: Any) -> dict[str, Any]:
        return {"saw": w}

    tools = ToolRegistry([Tool("write", write, "tool"), Tool("after", after, "pure")])
    plan = {
        "name": "report",
        "replay_verification": "human",
        "nodes": [
            {"id": "write", "type": "tool", "tool": "write"},
            {"id": "ok", "type": "approval", "depends_on": ["write"]},
            {"id": "after", "type": "pure", "tool": "after", "args": {"w": "${write}"},
             "depends_on": ["ok"]},
            {"id": "never", "type": "pure", "tool": "after", "args": {"w": "${after}"},
             "depends_on": ["after"]},
        ],
    }  # fmt: skip
    with Runtime(api.store.url, tools=tools, verifiers=[FileVerifier()]) as rt:
        job_id = rt.submit(plan, {}, namespace="a").job_id
        rt.run_job(job_id)
        rt.signal(job_id, f"{job_id}:ok", {"approved": True}, approver="ann")
        report.write_text("edited by hand\n")
        rt.run_job(job_id)
        assert rt.get_job(job_id).status == "parked"
    return job_id


def test_trace_page_of_a_parked_job(browser: Any, api: Api, tmp_path: Path) -> None:
    job_id = parked_job(api, tmp_path)
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
    states = {
        g.get_attribute("data-node"): g.get_attribute("data-state")
        for g in page.query_selector_all("#dag g.node")
    }
    assert (
        states
        == {
            "write": "side_effect_committed",
            "ok": "pure",
            "after": "pending",
            "never": "pending",
        }
        or states["write"] == "parked"
    )
    assert set(states) == {"write", "ok", "after", "never"}  # every node of the plan is drawn
    assert page.inner_text("#job-status") == "parked"
    assert "Parked on write (replay_verification)" in page.inner_text("#parked")
    assert len(page.query_selector_all("#dag path[data-edge]")) == 3
    rows = page.query_selector_all("#events tr[data-version]")
    assert len(rows) == api.store.get_job(job_id).version
    assert page.query_selector_all("#timeline rect[data-bar]")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"trace-parked-{api.store.backend}.png"), full_page=True)
    page.close()


def test_proof_badges_ok_then_failing_after_tampering(browser: Any, api: Api) -> None:
    job_id = api.waiting_job("a")
    api.runtime.signal(job_id, f"{job_id}:ok", {"approved": True}, approver="ann")
    api.runtime.run_job(job_id)
    assert api.runtime.get_job(job_id).status == "completed"

    def badges() -> dict[str, str]:
        page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
        found = {
            str(b.get_attribute("data-proof")): str(b.get_attribute("data-ok"))
            for b in page.query_selector_all("#proofs [data-proof]")
        }
        page.screenshot(path=str(ARTIFACTS / f"trace-proofs-{api.store.backend}.png"))
        page.close()
        return found

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert badges() == {"replay": "true", "ledger": "true", "chain": "true", "seal": "true"}
    # someone with write access to the database edits the tool's recorded result
    raw = RawDb(api.store.url)
    [(version, payload)] = raw.rows(
        "SELECT version, payload FROM events WHERE job_id = ? AND type = ?",
        (job_id, "tool_invocation_finished"),
    )
    edited = bytes(payload).replace(b'"x":1', b'"x":7')
    assert edited != bytes(payload)
    raw.set_payload(job_id, int(version), edited)
    after = badges()
    assert after["chain"] == "false"  # the stored chain no longer recomputes


def test_job_list_and_namespace(browser: Any, api: Api) -> None:
    mine = api.waiting_job("a")
    theirs = api.waiting_job("b")
    page = open_page(browser, api, "/ui/", "observer_a")
    listed = {r.get_attribute("data-job") for r in page.query_selector_all("#jobs tr[data-job]")}
    assert mine in listed and theirs not in listed
    page.click(f"a[href='/ui/jobs/{mine}']")
    page.wait_for_selector("#dag")
    assert page.get_attribute("#dag g[data-node=ok]", "data-state") == "waiting"
    assert f"--key {mine}:ok" in page.inner_text("[data-wait=ok]")
    page.close()
    # another namespace's job reads as not found
    other = open_page_error(browser, api, f"/ui/jobs/{theirs}", "observer_a")
    assert "not found" in other


def open_page_error(browser: Any, api: Api, path: str, who: str) -> str:
    page = browser.new_page()
    page.goto(api.url + path)
    page.fill("#key", api.keys[who].removeprefix("Bearer "))
    page.click("#login button[type=submit]")
    page.wait_for_selector("body[data-ready=error]")
    text = str(page.inner_text("#error"))
    page.close()
    return text


def test_bad_key_shows_the_error_and_forgets_it(browser: Any, api: Api) -> None:
    page = browser.new_page()
    page.goto(api.url + "/ui/")
    page.fill("#key", "afv_0000000000000000_" + "x" * 43)
    page.click("#login button[type=submit]")
    page.wait_for_selector("body[data-ready=error]")
    assert "invalid or revoked API key" in page.inner_text("#error")
    assert page.evaluate("sessionStorage.getItem('affidavit.key')") is None
    page.close()


def test_swagger_ui_at_docs_renders_with_no_network_but_the_servers(browser: Any, api: Api) -> None:
    """/docs is Swagger UI from files the server serves itself: a browser that may reach
    nothing but the API server renders every operation of /openapi.json."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    elsewhere: list[str] = []

    def only_the_server(route: Any) -> None:
        if route.request.url.startswith(api.url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_server)
    page.goto(api.url + "/docs")
    page.wait_for_selector(".opblock-summary-path", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert any("/api/jobs/{job_id}/verify" in p.replace("\u200b", "") for p in paths), paths
    assert elsewhere == []  # nothing fetched from a CDN
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "docs-offline.png"))
    page.close()


def test_trace_page_of_a_fork_links_to_its_source(browser: Any, api: Api) -> None:
    plan = {
        "name": "fork-ui",
        "nodes": [
            {"id": "a", "type": "tool", "tool": "act"},
            {"id": "b", "type": "tool", "tool": "act", "depends_on": ["a"]},
        ],
    }
    source = api.runtime.submit(plan, {}, namespace="a").job_id
    api.runtime.run_job(source)
    fork = api.runtime.fork(source, "a").job_id
    api.runtime.run_job(fork)
    page = open_page(browser, api, f"/ui/jobs/{fork}", "observer_a")
    assert f"Forked from {source} after step a" in page.inner_text("#forked-from")
    page.click("#forked-from a")
    page.wait_for_url(f"**/ui/jobs/{source}")
    page.wait_for_selector("body[data-ready]")
    assert page.inner_text("h1 .mono") == source
    assert not page.query_selector_all("#forked-from")  # the source is no fork
    page.close()
