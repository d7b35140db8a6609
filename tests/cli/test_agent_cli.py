"""Agent jobs from the command line (``cli``, tests/cli/test_cli.py) on both backends:
``run --agent``, ``submit --agent`` + ``worker``, ``signal`` / ``resume`` / ``cancel`` /
``jobs show|events``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import cli, json_of
from tests.cli.test_refusals_cli import database_exists

AGENT_TOOLS = str(Path(__file__).resolve().parents[1] / "runtime" / "agent_tools.py")


def test_run_agent_completes_and_is_idempotent(store_url: str) -> None:
    args = ["run", "--agent", "refund_agent", "--tools", AGENT_TOOLS,
            "--input", json.dumps({"order_id": "A-1"}), "--idempotency-key", "k",
            "--db", store_url, "--json"]  # fmt: skip
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    doc = json_of(first)
    assert doc["status"] == "completed" and doc["output"] == {"refunded": 40}
    again = json_of(cli(*args))
    assert again["job_id"] == doc["job_id"] and again["status"] == "completed"
    events = json_of(cli("jobs", "events", doc["job_id"], "--db", store_url, "--json"))
    types = [e["type"] for e in events]
    assert types[:2] == ["job_created", "agent_started"] and types.count("step_called") == 3


def test_submit_agent_then_worker_signal_and_cancel(store_url: str) -> None:
    order = json.dumps({"order_id": "BIG-1"})
    submitted = cli("submit", "--agent", "refund_agent", "--tools", AGENT_TOOLS,
                    "--input", order, "--db", store_url, "--json")  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = json_of(submitted)["job_id"]
    other = json_of(cli("submit", "--agent", "wait_agent", "--tools", AGENT_TOOLS,
                        "--db", store_url, "--json"))["job_id"]  # fmt: skip
    w = cli("worker", "--tools", AGENT_TOOLS, "--until-idle", "--db", store_url, "--json")
    assert w.returncode == 0, w.stderr
    assert json_of(w) == {"jobs_run": 2}
    shown = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert shown["status"] == "waiting"
    s = cli("signal", job_id, "--key", "big_refund", "--payload", '{"approved": true}',
            "--as", "ann", "--db", store_url, "--json")  # fmt: skip
    assert s.returncode == 0, s.stderr
    w = cli("worker", "--tools", AGENT_TOOLS, "--until-idle", "--db", store_url, "--json")
    assert json_of(w) == {"jobs_run": 1}
    done = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert done["status"] == "completed" and done["output"] == {"refunded": 250}
    c = cli("cancel", other, "--db", store_url, "--json")
    assert c.returncode == 0, c.stderr
    assert json_of(c)["status"] == "cancelled"


def test_bad_agent_submissions_write_nothing(empty_store_url: str, tmp_path: Path) -> None:
    cases = [
        (["--agent", "no_such_agent"], "not registered"),
        (["--agent", "refund_agent", "--input", '{"nope": 1}'], "does not fit"),
        (["--agent", "refund_agent", "--input", "[1]"], "JSON object"),
        ([str(tmp_path / "plan.yaml"), "--agent", "refund_agent"], "not both"),
        ([], "--agent"),
    ]
    for extra, fragment in cases:
        r = cli("submit", *extra, "--tools", AGENT_TOOLS, "--db", empty_store_url, "--json")
        assert r.returncode == 3, (extra, r.stdout, r.stderr)
        assert fragment in json_of(r)["error"]["message"], (extra, r.stdout)
    assert not database_exists(empty_store_url)  # refused before the database was opened
