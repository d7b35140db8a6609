"""``affidavit jobs fork`` and ``affidavit verify`` of a fork, as a user runs them, on both
backends: the fork names its source, a refused fork writes nothing, and verify checks the reused
steps against the source's record (a source gone: unverified by reference, not ✓)."""

from __future__ import annotations

import json
from typing import Any

import orjson

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.store import JobFilter
from tests.cli.test_cli import cli, json_of
from tests.verify.helpers import RawDb

COUNT: list[str] = []


def _act(ctx: ToolContext, x: int) -> dict[str, Any]:
    COUNT.append(ctx.node_id)
    return {"x": x}


TOOLS = ToolRegistry([Tool("act", _act, "tool")])
PLAN = {
    "name": "fork-cli",
    "nodes": [
        {"id": "a", "type": "tool", "tool": "act", "args": {"x": "${input.x}"}},
        {"id": "b", "type": "tool", "tool": "act", "args": {"x": "${input.x}"},
         "depends_on": ["a"]},
    ],
}  # fmt: skip


def test_jobs_fork_and_verify(store_url: str) -> None:
    COUNT.clear()
    with Runtime(store_url, tools=TOOLS) as rt:
        source = rt.submit(PLAN, {"x": 1}).job_id
        assert rt.run_job(source).status == "completed"
        jobs = len(rt.store.list_jobs(JobFilter()))
    refused = cli("jobs", "fork", source, "--from-step", "zz", "--db", store_url, "--json")
    assert refused.returncode == 3 and json_of(refused)["error"]["code"] == "fork_refused"
    bad = cli("jobs", "fork", source, "--from-step", "a", "--input", "{no", "--db", store_url)
    assert bad.returncode == 3 and "not valid JSON" in bad.stderr
    made = cli("jobs", "fork", source, "--from-step", "a", "--input", json.dumps({"x": 5}),
               "--db", store_url, "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    fork = json_of(made)["job_id"]
    with Runtime(store_url, tools=TOOLS) as rt:
        assert len(rt.store.list_jobs(JobFilter())) == jobs + 1  # the refusals wrote nothing
        assert rt.run_job(fork).status == "completed"
    assert COUNT == ["a", "b", "b"]  # a ran once, in the source
    shown = json_of(cli("jobs", "show", fork, "--db", store_url, "--json"))
    assert shown["forked_from"]["job_id"] == source and shown["forked_from"]["step"] == "a"
    verified = cli("verify", fork, "--db", store_url, "--json")
    assert verified.returncode == 0, verified.stdout
    assert json_of(verified)["forked_from"]["status"] == "verified"
    human = cli("verify", fork, "--db", store_url)
    assert "reused steps match the source's sealed record" in human.stdout
    # the record names a source this database does not hold: not ✓, said so
    raw = RawDb(store_url)
    created = orjson.loads(raw.events(fork)[0][3])
    created["forked_from"]["job_id"] = "job-elsewhere"
    raw.set_payload(fork, 1, orjson.dumps(created))
    human = cli("verify", fork, "--db", store_url)
    assert human.returncode == 1  # the edit broke the chain
    assert "unverified by reference" in human.stdout


def test_jobs_fork_with_an_idempotency_key(store_url: str) -> None:
    with Runtime(store_url, tools=TOOLS) as rt:
        source = rt.submit(PLAN, {"x": 1}).job_id
        assert rt.run_job(source).status == "completed"
    key = ("--idempotency-key", "fork-cli-1", "--db", store_url, "--json")
    first = cli("jobs", "fork", source, "--from-step", "a", *key)
    again = cli("jobs", "fork", source, "--from-step", "a", *key)
    assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
    assert json_of(first)["job_id"] == json_of(again)["job_id"]
    other = cli("jobs", "fork", source, "--from-step", "a", "--input", '{"x": 2}', *key)
    assert other.returncode == 3
    assert json_of(other)["error"]["code"] == "idempotency_conflict"
    with Runtime(store_url, tools=TOOLS) as rt:
        assert len(rt.store.list_jobs(JobFilter())) == 2  # the source and one fork
