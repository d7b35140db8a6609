"""``affidavit queues set | list | show``, ``submit --queue ...`` and ``worker --queue``, as a
user runs them, both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affidavit.examples import refund
from affidavit.store import open_store
from affidavit.store.queues import recorded_grants
from tests.cli.test_cli import cli, json_of
from tests.cli.test_runtime_cli import TOOLS, order


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return refund.setup_shop(tmp_path / "shop")


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "refund.json"
    path.write_text(json.dumps(refund.PLAN))
    return path


def test_queues_set_list_show(store_url: str) -> None:
    r = cli("queues", "set", "llm", "--concurrency", "8", "--worker-concurrency", "2",
            "--rate", "100/60s", "--priority", "--partitioned",
            "--db", store_url, "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    listed = json_of(cli("queues", "list", "--db", store_url, "--json"))["queues"]
    assert [q["name"] for q in listed] == ["llm"]
    shown = json_of(cli("queues", "show", "llm", "--db", store_url, "--json"))
    assert {k: shown[k] for k in ("concurrency", "rate", "pending")} == {
        "concurrency": 8,
        "rate": "100/60s",
        "pending": 0,
    }
    missing = cli("queues", "show", "nope", "--db", store_url, "--json")
    assert missing.returncode == 3
    assert "queues set" in json_of(missing)["error"]["hint"]
    bad = cli("queues", "set", "llm", "--rate", "lots", "--db", store_url, "--json")
    assert bad.returncode == 3
    assert "N/PERIOD" in json_of(bad)["error"]["message"]


def test_submit_to_a_queue_and_a_worker_of_that_queue(
    store_url: str, shop: Path, plan_file: Path
) -> None:
    assert cli("queues", "set", "refunds", "--partitioned", "--db", store_url).returncode == 0
    unknown = cli("submit", str(plan_file), "--tools", TOOLS, "--input", order(shop),
                  "--queue", "nope", "--db", store_url, "--json")  # fmt: skip
    assert unknown.returncode == 3
    assert "queues set nope" in json_of(unknown)["error"]["hint"]
    ids = []
    for order_id in ("A-1001", "A-1002"):
        r = cli("submit", str(plan_file), "--tools", TOOLS, "--input", order(shop, order_id),
                "--queue", "refunds", "--partition-key", "customer-7",
                "--not-before", "2000-01-01T00:00:00Z", "--db", store_url, "--json")  # fmt: skip
        assert r.returncode == 0, r.stderr
        ids.append(json_of(r)["job_id"])
    # a worker of the default queue alone does not take them
    w = cli("worker", "--tools", TOOLS, "--until-idle", "--queue", "default",
            "--db", store_url, "--json")  # fmt: skip
    assert json_of(w) == {"jobs_run": 0}, w.stderr
    w = cli("worker", "--tools", TOOLS, "--until-idle", "--queue", "refunds",
            "--db", store_url, "--json")  # fmt: skip
    assert json_of(w) == {"jobs_run": 2}, w.stderr
    store = open_store(store_url)
    try:
        grants = recorded_grants(store, "refunds", 0.0)
    finally:
        store.close()
    assert [g["job_id"] for g in grants] == ids  # one partition: in submission order
    assert all(g["slot"] == 0 for g in grants)
    # each job shows its claim; its verification result is the same document as any job's
    shown = json_of(cli("jobs", "show", ids[0], "--db", store_url, "--json"))
    assert [
        (c["queue"], c["slot"], c["started"], c["ended_as"]) for c in shown["queue_claims"]
    ] == [("refunds", 0, True, "completed")]
    assert shown["queue_claims"][0]["ended_at"] >= shown["queue_claims"][0]["claimed_at"]
    verified = cli("verify", ids[0], "--db", store_url, "--json")
    assert verified.returncode == 0 and "queue_claims" not in json_of(verified)
    proved = cli("verify", "--queue", "refunds", "--since", "2000-01-01T00:00:00Z",
                 "--db", store_url, "--json")  # fmt: skip
    assert proved.returncode == 0, proved.stdout
    assert json_of(proved) | {"since": None, "until": None} == {
        "queue": "refunds", "limits": json_of(proved)["limits"], "since": None, "until": None,
        "grants": 2, "starts": 2, "rate": None, "concurrency": None,
        "worker_concurrency": None, "unknown_ends": [], "ok": True,
    }  # fmt: skip


def test_bad_not_before_refused(store_url: str, shop: Path, plan_file: Path) -> None:
    assert cli("queues", "set", "later", "--db", store_url).returncode == 0
    for text in ("tomorrow", "2030-01-01T00:00:00"):
        r = cli("submit", str(plan_file), "--tools", TOOLS, "--input", order(shop),
                "--queue", "later", "--not-before", text, "--db", store_url, "--json")  # fmt: skip
        assert r.returncode == 3
        assert "ISO 8601" in json_of(r)["error"]["message"]
