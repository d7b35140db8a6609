"""``affidavit verify --limit NAME --since T``: a tool or model limit across jobs, from the
grants the jobs' logs record, on both backends — the runtime's logs pass; a forged overlap
or a recorded rate the starts exceeded fails; a call a later claim closed counts until then."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from affidavit import Limit, Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.errors import ConfigError
from affidavit.store import Store
from affidavit.verify.tool_limits import verify_limit
from tests.cli.test_cli import cli, json_of
from tests.runtime.helpers import node, plan


def chat(ctx: ToolContext) -> str:
    time.sleep(0.01)
    return ctx.node_id


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def now_us() -> int:
    return time.time_ns() // 1000


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    tools = [
        Tool("chat", chat, "tool", limit=Limit(rate="20/1m", concurrency=1)),
        Tool("llm", chat, "pure", limit=Limit(rate="20/1m", concurrency=1)),
    ]
    with Runtime(store_url, tools=ToolRegistry(tools), step_concurrency=2) as runtime:
        yield runtime


def run_jobs(rt: Runtime, tool: str, kind: str, jobs: int = 2) -> list[str]:
    ids = [
        rt.submit(plan(node("a", tool, kind), node("b", tool, kind)), {}).job_id
        for _ in range(jobs)
    ]
    rt.run_until_idle(concurrency=jobs)
    assert {rt.store.get_job(j).status for j in ids} == {"completed"}
    return ids


def grant_events(store: Store, job_id: str) -> list[tuple[int, dict[str, Any]]]:
    return [(e.version, e.payload) for e in store.list_events(job_id) if "limit_grant" in e.payload]


def rewrite(store: Store, job_id: str, version: int, payload: dict[str, Any]) -> None:
    """An operator editing a stored event (its chain breaks: `verify JOB` reports that)."""
    with store.transaction() as tx:
        tx.execute(
            "UPDATE events SET payload = ? WHERE job_id = ? AND version = ?",
            (orjson.dumps(payload), job_id, version),
        )


@pytest.mark.parametrize(("tool", "kind"), [("chat", "tool"), ("llm", "pure")])
def test_the_runtimes_logs_hold_the_limit_across_jobs(rt: Runtime, tool: str, kind: str) -> None:
    since = now_us() - 1_000_000
    ids = run_jobs(rt, tool, kind)
    proof = verify_limit(rt.store, tool, since, now_us())
    assert proof.ok, proof.to_dict()
    assert (proof.calls, proof.jobs, proof.open_calls, proof.malformed) == (4, 2, 0, [])
    assert proof.concurrency is not None and proof.concurrency.worst == 1
    assert proof.rate is not None and proof.rate.worst == 4 and proof.rate.limit == 20
    assert sorted(set(proof.rate.job_ids)) == sorted(ids)


@pytest.mark.parametrize(("tool", "kind"), [("chat", "tool"), ("llm", "pure")])
def test_a_forged_overlap_between_jobs_fails(rt: Runtime, tool: str, kind: str) -> None:
    since = now_us() - 1_000_000
    first, second = run_jobs(rt, tool, kind)
    earliest = min(
        (
            p["limit_grant"]["granted_at"]
            for j in (first, second)
            for _, p in grant_events(rt.store, j)
        )
    )
    owner = next(
        j
        for j in (first, second)
        for _, p in grant_events(rt.store, j)
        if p["limit_grant"]["granted_at"] == earliest
    )
    other = second if owner == first else first
    version, payload = grant_events(rt.store, other)[0]
    payload["limit_grant"]["granted_at"] = earliest  # began while the other job's call ran
    rewrite(rt.store, other, version, payload)
    proof = verify_limit(rt.store, tool, since, now_us())
    assert not proof.ok
    assert proof.concurrency is not None and proof.concurrency.worst == 2
    assert sorted(proof.concurrency.job_ids) == sorted([first, second])


def test_starts_past_the_recorded_rate_fail(rt: Runtime) -> None:
    since = now_us() - 1_000_000
    ids = run_jobs(rt, "chat", "tool")
    for job_id in ids:
        for version, payload in grant_events(rt.store, job_id):
            payload["limit_grant"]["rate"] = [3, 60_000_000]
            rewrite(rt.store, job_id, version, payload)
    proof = verify_limit(rt.store, "chat", since, now_us())
    assert not proof.ok and proof.rate is not None
    assert (proof.rate.worst, proof.rate.limit) == (4, 3)


def test_a_call_closed_by_a_later_claim_counts_until_then(rt: Runtime) -> None:
    since = now_us() - 1_000_000
    job_id = run_jobs(rt, "chat", "tool", jobs=1)[0]
    finish = next(e for e in rt.store.list_events(job_id) if e.type == "tool_invocation_finished")
    payload = {**finish.payload, "outcome": "unknown"}  # as a later claim closes a lost call
    rewrite(rt.store, job_id, finish.version, payload)
    proof = verify_limit(rt.store, "chat", since, now_us())
    assert proof.ok and proof.bounded_ends == 1


def test_a_malformed_grant_fails(rt: Runtime) -> None:
    since = now_us() - 1_000_000
    job_id = run_jobs(rt, "chat", "tool", jobs=1)[0]
    version, payload = grant_events(rt.store, job_id)[0]
    payload["limit_grant"]["granted_at"] = "yesterday"
    rewrite(rt.store, job_id, version, payload)
    proof = verify_limit(rt.store, "chat", since, now_us())
    assert not proof.ok and proof.malformed == [job_id]


def test_an_unknown_limit_or_a_future_since_is_refused(rt: Runtime) -> None:
    run_jobs(rt, "chat", "tool", jobs=1)
    with pytest.raises(ConfigError, match="no limit"):
        verify_limit(rt.store, "nope", 0, now_us())
    with pytest.raises(ConfigError, match="future"):
        verify_limit(rt.store, "chat", now_us() + 60_000_000, now_us())


def test_the_command_verifies_and_reports(rt: Runtime, store_url: str) -> None:
    since = iso(time.time() - 1)
    first, _ = run_jobs(rt, "chat", "tool")
    ok = cli("verify", "--limit", "chat", "--since", since, "--json", "--db", store_url)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = json_of(ok)
    assert doc["ok"] and doc["calls"] == 4 and doc["concurrency"]["worst"] == 1
    version, payload = grant_events(rt.store, first)[1]
    payload["limit_grant"]["concurrency"] = 1
    payload["limit_grant"]["granted_at"] = grant_events(rt.store, first)[0][1]["limit_grant"][
        "granted_at"
    ]
    rewrite(rt.store, first, version, payload)
    table = cli("verify", "--limit", "chat", "--since", since, "--db", store_url)
    assert table.returncode == 1 and "NOT verified" in table.stdout, table.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("--limit", "chat"),  # no --since
        ("--limit", "chat", "--since", "yesterday"),
        ("--limit", "chat", "--since", "2026-01-01T00:00:00Z", "--queue", "q"),
        ("--limit", "chat", "--since", "2026-01-01T00:00:00Z", "--all"),
        ("--limit", "nope", "--since", "2026-01-01T00:00:00Z"),  # never used
        ("--limit", "", "--since", "2026-01-01T00:00:00Z"),
    ],
)
def test_bad_input_exits_3(rt: Runtime, store_url: str, args: tuple[str, ...]) -> None:
    run_jobs(rt, "chat", "tool", jobs=1)
    result = cli("verify", *args, "--json", "--db", store_url)
    assert result.returncode == 3, result.stdout + result.stderr
