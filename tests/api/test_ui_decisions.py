"""Deciding from the trace page, in a real headless Chromium against the real API server, on
both backends: what each role may do, approvals, signals, resumes pinned to a park, the list of
what waits for people. Every decision must land in the log as the CLI's would and the job must
verify afterwards.

With ``AFFIDAVIT_UI_SCREENSHOTS=1`` the run also rewrites the documentation's screenshots under
``docs/img/`` (from the SQLite run: ``DOCS_SHOTS``); otherwise screenshots go to
``test-artifacts/``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import affidavit.core.crash as crash_module
from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.plan import external_key
from affidavit.verify import verify_job
from tests.api.conftest import Api
from tests.api.test_ui import ARTIFACTS, CHROMIUM, open_page, parked_job, sync_api
from tests.runtime.helpers import SimulatedCrash, wait_lease_expired

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
DOCS_SHOTS = {"ui-decision"}  # the pictures docs/ui.md shows
REFUND = {"order": "A-17", "amount": 42}


def _refund(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    return {"refunded": args["amount"], "ref": ctx.external_key}


def _think(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    return {"thought": args}


def _bank_down(ctx: ToolContext, **args: Any) -> Any:
    raise ConnectionError("the bank's API is down")


TOOLS = ToolRegistry(
    [
        Tool("refund", _refund, "tool"),
        Tool("think", _think, "pure"),
        Tool("refund_checked", _refund, "tool", reconcile_fn=_bank_down),
    ]
)

APPROVAL_PLAN: dict[str, Any] = {
    "name": "refund-approval",
    "nodes": [
        {"id": "look", "type": "pure", "tool": "think", "args": {"order": "${input.order}"}},
        {"id": "ok", "type": "approval", "depends_on": ["look"],
         "args": {"refund": "${input.amount}", "order": "${look.thought.order}"}},
        {"id": "pay", "type": "tool", "tool": "refund", "depends_on": ["ok"],
         "args": {"order": "${input.order}", "amount": "${input.amount}"}},
    ],
}  # fmt: skip
SIGNAL_PLAN: dict[str, Any] = {
    "name": "refund-signal",
    "nodes": [
        {"id": "bank", "type": "wait"},
        {"id": "t", "type": "pure", "tool": "think", "args": {"bank": "${bank}"},
         "depends_on": ["bank"]},
    ],
}  # fmt: skip
PAY_PLAN: dict[str, Any] = {
    "name": "refund-pay",
    "nodes": [
        {"id": "pay", "type": "tool", "tool": "refund",
         "args": {"order": "${input.order}", "amount": "${input.amount}"}},
    ],
}  # fmt: skip


def docs_screenshot(page: Any, api: Api, name: str) -> None:
    """The page as the docs show it: rewritten under docs/img only when asked (so that a test
    run leaves the tree clean), and only from the SQLite run (one picture per name)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}-{api.store.backend}.png"), full_page=True)
    if (
        name in DOCS_SHOTS
        and os.environ.get("AFFIDAVIT_UI_SCREENSHOTS") == "1"
        and api.store.backend == "sqlite"
    ):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / f"{name}.png"), full_page=True)


def runtime(api: Api, **kw: Any) -> Runtime:
    return Runtime(api.store.url, tools=TOOLS, **kw)


def waiting(api: Api, plan: dict[str, Any], job_input: Any = None) -> str:
    with runtime(api) as rt:
        job_id = rt.submit(plan, job_input or REFUND, namespace="a").job_id
        rt.run_job(job_id)
        assert rt.get_job(job_id).status == "waiting"
    return job_id


def run(api: Api, job_id: str) -> str:
    with runtime(api) as rt:
        return rt.run_job(job_id).status


def park_in_flight(
    api: Api,
    monkeypatch: pytest.MonkeyPatch,
    job_id: str | None = None,
    plan: dict[str, Any] = PAY_PLAN,
) -> str:
    """The refund job (a new one when ``job_id`` is None) run until its tool step "crashes"
    after T1, then recovered: parked in flight (the tool has no reconcile hook)."""

    def crash_point(name: str) -> None:
        if name == "tool.after_acquire":
            raise SimulatedCrash(name)

    with runtime(api, lease_seconds=0.3) as rt:
        if job_id is None:
            job_id = rt.submit(plan, REFUND, namespace="a").job_id
        with monkeypatch.context() as patched:
            patched.setattr(crash_module, "crash_point", crash_point)
            with pytest.raises(SimulatedCrash):
                rt.run_job(job_id)
        wait_lease_expired(rt.store, job_id)
        assert rt.run_job(job_id).status == "parked"
    return job_id


def ledger(api: Api, job_id: str) -> list[Any]:
    with api.store.snapshot() as snap:
        return snap.ledger_list(job_id)


def events_of(api: Api, job_id: str, event_type: str) -> list[dict[str, Any]]:
    return [e.payload for e in api.store.list_events(job_id) if e.type == event_type]


def decided(page: Any) -> str:
    """What the page says once the API accepted the decision (its reply, not a timer)."""
    page.wait_for_selector("#decided:not([hidden])")
    return str(page.inner_text("#decided"))


def refused(page: Any) -> str:
    """What the decision panel says once the decision was refused (by the page or the API)."""
    page.wait_for_selector("#decide-status:not([hidden])")
    return str(page.inner_text("#decide-status"))


def wait_status(page: Any, status: str) -> None:
    """The page shows ``status`` (it polls the job while it is not terminal; no reload)."""
    page.wait_for_selector(f"#content[data-status={status}]", timeout=60_000)


def post_from_page(page: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request made in the page with the key it holds, bypassing its buttons."""
    result: dict[str, Any] = page.evaluate(
        """async ([path, body]) => {
            const r = await fetch(path, {method: "POST", headers: {
                "Authorization": `Bearer ${sessionStorage.getItem("affidavit.key")}`,
                "Content-Type": "application/json"}, body: JSON.stringify(body)});
            return {status: r.status, body: await r.json()};
        }""",
        [path, body],
    )
    return result


# --- the decision context over HTTP ------------------------------------------------------------


def test_decisions_api_describes_the_park_and_the_waits(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = park_in_flight(api, monkeypatch)
    [row] = ledger(api, job_id)
    with api.client("agent_a") as c:
        found = c.get(f"/api/jobs/{job_id}/decisions").json()
    park = found["park"]
    assert park["reason"] == "in_flight" and park["tool"] == "refund"
    assert park["args"] == REFUND
    assert park["idempotency_key"] == row.idempotency_key
    assert park["external_key"] == external_key(job_id, row.step_id, row.attempt_id)
    assert park["reconcile"] == {"hook": False, "error": None}
    assert park["decisions"] == ["retry", "accept_result", "fail"]
    assert park["version"] == api.store.get_job(job_id).version
    assert found["caller"] == {
        "agent_id": "bot-a",
        "role": "agent",
        "key_id": api.keys["agent_a"].split("_")[1],
        "may_signal": True,
        "may_approve": False,
        "may_resume": False,
    }
    approval = waiting(api, APPROVAL_PLAN)
    with api.client("observer_a") as c:
        found = c.get(f"/api/jobs/{approval}/decisions").json()
        assert c.get(f"/api/jobs/{approval}/decisions").status_code == 200
    assert found["park"] is None
    [wait] = found["waits"]
    assert wait["wait_type"] == "approval" and wait["correlation_key"] == f"{approval}:ok"
    assert wait["payload"] == {"refund": 42, "order": "A-17"}
    assert wait["since"]
    assert found["caller"]["may_signal"] is False
    assert found["caller"]["may_approve"] is False and wait["may_decide"] is False
    with api.client("agent_b") as c:  # another namespace's job: not found
        assert c.get(f"/api/jobs/{approval}/decisions").status_code == 404


def test_decisions_api_says_what_a_failed_reconcile_hook_said(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = {"nodes": [{**PAY_PLAN["nodes"][0], "tool": "refund_checked"}]}
    job_id = park_in_flight(api, monkeypatch, plan=checked)
    with api.client("admin") as c:
        park = c.get(f"/api/jobs/{job_id}/decisions").json()["park"]
    assert park["tool"] == "refund_checked"
    assert park["reconcile"]["hook"] is True
    assert "the bank's API is down" in park["reconcile"]["error"]["message"]
    assert "reconcile hook failed" in park["message"]


# --- the page --------------------------------------------------------------------------------


def test_observer_sees_no_buttons_and_a_forged_decision_is_refused(
    browser: Any, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    approval = waiting(api, APPROVAL_PLAN)
    parked = park_in_flight(api, monkeypatch)
    before = {j: api.store.get_job(j).version for j in (approval, parked)}
    for job_id in (approval, parked):
        page = open_page(browser, api, f"/ui/jobs/{job_id}", "observer_a")
        assert page.query_selector("#decide") is not None  # what waits is shown ...
        assert page.query_selector_all("#decide button") == []  # ... but not to be decided
        assert page.query_selector_all("#decide textarea") == []
        assert "it may look, not decide" in page.inner_text("#decide") or (
            "needs an admin key" in page.inner_text("#decide")
        )
        forged_signal = post_from_page(
            page, f"/api/jobs/{job_id}/signal", {"key": f"{job_id}:ok", "payload": True}
        )
        forged_resume = post_from_page(
            page, f"/api/jobs/{job_id}/resume", {"decision": "retry", "park_version": 1}
        )
        assert forged_signal["status"] == 403, forged_signal
        assert forged_resume["status"] == 403, forged_resume
        assert forged_signal["body"]["error"]["code"] == "forbidden"
        page.close()
    # an agent may signal but not resume: no resume buttons for it either
    page = open_page(browser, api, f"/ui/jobs/{parked}", "agent_a")
    assert page.query_selector_all("#resume button") == []
    assert "needs an admin key" in page.inner_text("#resume-denied")
    forged = post_from_page(page, f"/api/jobs/{parked}/resume", {"decision": "retry"})
    assert forged["status"] == 403
    page.close()
    assert {j: api.store.get_job(j).version for j in (approval, parked)} == before


def test_approver_approves_with_a_comment_and_the_job_completes(browser: Any, api: Api) -> None:
    job_id = waiting(api, APPROVAL_PLAN)
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "approver_a")
    shown = json.loads(page.inner_text("[data-wait-node=ok] [data-fact=payload]"))
    assert shown == {"refund": 42, "order": "A-17"}  # what the plan asks approval for
    page.fill("[data-wait-node=ok] textarea.comment", "checked the order, refund is fine")
    docs_screenshot(page, api, "ui-approval")
    page.click("[data-wait-node=ok] button[data-action=approve]")
    assert "Approved by ann" in decided(page)
    wait_status(page, "pending")
    assert run(api, job_id) == "completed"
    wait_status(page, "completed")  # the page followed the job by itself
    assert page.query_selector("#decide") is None
    [signal] = events_of(api, job_id, "wait_completed")
    assert signal["signalled_by"] == "ann" and signal["at"]
    assert signal["payload"] == {"approved": True, "comment": "checked the order, refund is fine"}
    assert verify_job(api.store, job_id).ok
    page.wait_for_selector("#proofs [data-proof=seal][data-ok=true]")
    page.close()


def test_approver_denies_and_the_job_fails(browser: Any, api: Api) -> None:
    job_id = waiting(api, APPROVAL_PLAN)
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "approver_a")
    page.click("[data-wait-node=ok] button[data-action=deny]")
    assert "Denied by ann" in decided(page)
    page.close()
    assert run(api, job_id) == "failed"
    [signal] = events_of(api, job_id, "wait_completed")
    assert signal["payload"] == {"approved": False}
    assert verify_job(api.store, job_id).ok


def test_an_approval_answered_meanwhile_is_not_answered_twice(browser: Any, api: Api) -> None:
    job_id = waiting(api, APPROVAL_PLAN)
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "approver_a")
    assert page.inner_text("#who") == "ann (approver)"
    page.fill("[data-wait-node=ok] textarea.comment", "looks fine")
    with runtime(api) as rt:  # someone else answers first
        rt.signal(job_id, f"{job_id}:ok", {"approved": False}, approver="ops-desk")
    page.click("[data-wait-node=ok] button[data-action=approve]")
    assert "answered already: nothing was recorded" in decided(page)
    page.close()
    [signal] = events_of(api, job_id, "wait_completed")
    assert (signal["payload"], signal["signalled_by"]) == ({"approved": False}, "operator:ops-desk")
    assert run(api, job_id) == "failed"
    assert verify_job(api.store, job_id).ok


def test_signal_payload_is_checked_before_it_is_sent(browser: Any, api: Api) -> None:
    job_id = waiting(api, SIGNAL_PLAN)
    version = api.store.get_job(job_id).version
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "agent_a")
    assert page.get_attribute("[data-wait-node=bank]", "data-wait-type") == "signal"
    editor = "#signal-bank"
    page.fill(editor, '{"cleared": tru')
    assert "not JSON" in page.inner_text("[data-for=signal-bank]")
    page.click("[data-wait-node=bank] button[data-action=signal]")
    assert "is not JSON" in refused(page)
    assert api.store.get_job(job_id).version == version  # nothing was sent
    page.fill(editor, '{"cleared": true, "ref": "BNK-9"}')
    assert page.inner_text("[data-for=signal-bank]") == "valid JSON"
    page.click("[data-wait-node=bank] button[data-action=signal]")
    assert "Signal sent by bot-a" in decided(page)
    page.close()
    assert run(api, job_id) == "completed"
    output = api.store.get_job(job_id).output
    assert output["t"] == {"thought": {"bank": {"cleared": True, "ref": "BNK-9"}}}
    assert verify_job(api.store, job_id).ok


def test_parked_step_resumed_with_a_result_typed_in_the_page(
    browser: Any, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = park_in_flight(api, monkeypatch)
    [row] = ledger(api, job_id)
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "admin")
    assert page.inner_text("#park [data-fact=tool]") == "refund"
    assert json.loads(page.inner_text("#park [data-fact=args]")) == REFUND
    assert page.inner_text("#park [data-fact=idempotency-key]") == row.idempotency_key
    external = external_key(job_id, row.step_id, row.attempt_id)
    assert page.inner_text("#park [data-fact=external-key]") == external
    assert "no reconcile hook" in page.inner_text("#park [data-fact=reconcile]")
    buttons = [b.get_attribute("data-decision") for b in page.query_selector_all("#resume button")]
    assert buttons == ["retry", "accept_result", "fail"]
    typed = {"refunded": 42, "ref": external, "checked_in": "the bank's portal"}
    page.fill("#resume-result", json.dumps(typed))
    page.fill("#resume-note", "the bank shows the refund")
    docs_screenshot(page, api, "ui-decision")
    page.click("#resume button[data-decision=accept_result]")
    assert "Resumed (accept_result) by root" in decided(page)
    page.close()
    assert run(api, job_id) == "completed"
    assert api.store.get_job(job_id).output == {"pay": typed}
    [resumed] = events_of(api, job_id, "job_resumed")
    assert resumed["by"] == "root" and resumed["at"]
    assert (resumed["decision"], resumed["result"]) == ("accept_result", typed)
    assert resumed["note"] == "the bank shows the refund"
    assert verify_job(api.store, job_id).ok


def test_a_decision_on_a_stale_park_is_refused(
    browser: Any, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = park_in_flight(api, monkeypatch)
    first = api.store.get_job(job_id).version
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "admin")
    assert page.get_attribute("#resume", "data-park-version") == str(first)
    page.fill("#resume-result", '{"refunded": 42}')  # the person is deciding ...
    with runtime(api) as rt:  # ... while someone else retries, and the retry parks again
        rt.resume(job_id, "retry", park_version=first)
    park_in_flight(api, monkeypatch, job_id)
    second = api.store.get_job(job_id).version
    assert second > first
    page.click("#resume button[data-decision=accept_result]")
    refusal = refused(page)
    assert f"not by the park at version {first}: nothing was decided" in refusal, refusal
    assert api.store.get_job(job_id).version == second  # nothing written
    # the page says the job moved on, and shows the park in force when asked
    page.wait_for_selector("#decide-changed")
    page.click("#decide-changed button")
    page.wait_for_selector(f"#resume[data-park-version='{second}']")
    page.fill("#resume-result", '{"refunded": 42, "by": "page"}')
    page.click("#resume button[data-decision=accept_result]")
    assert "Resumed (accept_result)" in decided(page)
    page.close()
    assert run(api, job_id) == "completed"
    assert verify_job(api.store, job_id).ok


def test_mismatch_shown_recorded_against_observed(browser: Any, api: Api, tmp_path: Path) -> None:
    job_id = parked_job(api, tmp_path)
    page = open_page(browser, api, f"/ui/jobs/{job_id}", "admin")
    assert page.get_attribute("#park", "data-reason") == "replay_verification"
    recorded = page.inner_text("#mismatches [data-fact=recorded]")
    observed = page.inner_text("#mismatches [data-fact=observed]")
    assert recorded.startswith("sha256:") and observed.startswith("sha256:")
    assert recorded != observed
    assert json.loads(page.inner_text("#park [data-fact=recorded-result]")) == {
        "path": str(tmp_path / "report.txt")
    }
    buttons = [b.get_attribute("data-decision") for b in page.query_selector_all("#resume button")]
    assert buttons == ["continue", "fail"]
    assert page.query_selector("#resume-result") is None  # no result goes with these
    docs_screenshot(page, api, "ui-mismatch")
    page.click("#resume button[data-decision=fail]")
    assert "Resumed (fail) by root" in decided(page)
    wait_status(page, "failed")
    page.close()
    assert verify_job(api.store, job_id).ok


def test_waiting_list_shows_what_waits_for_people_first(
    browser: Any, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    approval = waiting(api, APPROVAL_PLAN)
    parked = park_in_flight(api, monkeypatch)
    with runtime(api) as rt:  # newer jobs, finished: listed after the ones that wait
        done = [rt.submit(PAY_PLAN, REFUND, namespace="a").job_id for _ in range(3)]
        for job_id in done:
            assert rt.run_job(job_id).status == "completed"

    def rows(page: Any, table: str) -> list[str]:
        return [
            str(r.get_attribute("data-job"))
            for r in page.query_selector_all(f"#{table} tr[data-job]")
        ]

    page = open_page(browser, api, "/ui/", "observer_a")
    people = rows(page, "waiting")
    assert {approval, parked} <= set(people) and not set(done) & set(people)
    statuses = {page.get_attribute(f"#waiting tr[data-job='{j}']", "data-status") for j in people}
    assert statuses <= {"waiting", "parked"}
    # the list of what waits comes before the list of every job, and says since when
    assert page.evaluate(
        "document.querySelector('#waiting').compareDocumentPosition("
        "document.querySelector('#jobs')) & Node.DOCUMENT_POSITION_FOLLOWING"
    )
    since = page.inner_text(f"#waiting tr[data-job='{parked}'] .since")
    assert api.store.get_job(parked).updated_at in since and "ago" in since
    assert set(done) <= set(rows(page, "jobs"))
    page.close()
    # filtered by status, a page at a time
    page = open_page(browser, api, "/ui/?status=completed&limit=2", "observer_a")
    first = rows(page, "jobs")
    assert len(first) == 2 and first == done[::-1][:2]
    assert page.query_selector("#waiting") is None
    page.click("a[data-page=next]")
    page.wait_for_selector("a[data-page=first]")
    second = rows(page, "jobs")
    assert second and second[0] == done[0] and not set(first) & set(second)
    assert {page.get_attribute(f"#jobs tr[data-job='{j}']", "data-status") for j in second} == {
        "completed"
    }
    page.select_option("#status-filter", "parked")
    page.wait_for_selector("#jobs tr[data-status=parked]")
    assert parked in rows(page, "jobs")
    page.close()


def test_key_never_in_a_url(browser: Any, api: Api) -> None:
    """The page sends the key only in the Authorization header: no request URL holds it."""
    job_id = waiting(api, APPROVAL_PLAN)
    page = browser.new_page()
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.goto(api.url + f"/ui/jobs/{job_id}")
    key = api.keys["approver_a"].removeprefix("Bearer ")
    page.fill("#key", key)
    page.click("#login button[type=submit]")
    page.wait_for_selector("body[data-ready=true]")
    page.click("[data-wait-node=ok] button[data-action=approve]")
    decided(page)
    page.close()
    secret = key.rsplit("_", 1)[1]
    assert urls and not [u for u in urls if secret in u or key in u]
