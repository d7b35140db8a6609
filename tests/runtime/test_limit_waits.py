"""A call waiting for a limit's grant shows in ``jobs show`` (human and ``--json``) and in the
trace, and not in the job's log; conflicting declarations of one limit are refused when a
worker starts. Both backends."""

from __future__ import annotations

import json
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from affidavit import Limit, Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.errors import ConfigError
from affidavit.record import job_trace
from affidavit.runtime._worker import Worker
from affidavit.store import Store, open_store
from affidavit.store.limit_waits import waiting_for_limit
from tests.cli.test_cli import cli, cli_process
from tests.runtime.helpers import node, plan


def gate_registry(name: str, release: threading.Event) -> ToolRegistry:
    """``gate``: a call that holds the limit ``name`` (one at a time) until ``release``."""

    def gate(ctx: ToolContext) -> str:
        assert release.wait(60)
        return ctx.node_id

    return ToolRegistry([Tool("gate", gate, "tool", limit=Limit(concurrency=1, name=name))])


def wait_rows(store: Store) -> int:
    with store.transaction(durable=False) as tx:
        return int(tx.query("SELECT count(*) FROM limit_waits")[0][0])


@contextmanager
def one_call_waiting(url: str, namespace: str = "default") -> Iterator[tuple[Runtime, str, str]]:
    """A running job of two ``gate`` calls at once under a concurrency-1 limit: the first holds
    the grant, the second waits, until the block ends (then the job completes)."""
    name = f"gate-{uuid.uuid4().hex[:8]}"
    release = threading.Event()
    tools = gate_registry(name, release)
    with Runtime(url, tools=tools, step_concurrency=2) as rt:
        job_id = rt.submit(plan(node("a", "gate"), node("b", "gate")), {}, namespace=namespace)
        job_id = job_id.job_id
        runner = threading.Thread(target=rt.run_until_idle)
        runner.start()
        try:
            end = time.monotonic() + 60
            while waiting_for_limit(rt.store, job_id, now_s=time.time()) is None:
                assert time.monotonic() < end, "the second call never waited"
                time.sleep(0.01)
            yield rt, job_id, name
        finally:
            release.set()
            runner.join(60)
        assert rt.get_job(job_id).status == "completed"


def test_a_waiting_call_shows_in_jobs_show_and_the_trace(store_url: str) -> None:
    with one_call_waiting(store_url) as (rt, job_id, name):
        shown = cli("jobs", "show", job_id, "--json", "--db", store_url)
        assert shown.returncode == 0, shown.stderr
        wait = json.loads(shown.stdout)["waiting_for_limit"]
        assert wait["limit"] == name and wait["reason"] == "1 of 1 in flight"
        assert wait["since"].endswith("Z")
        human = cli("jobs", "show", job_id, "--db", store_url)
        assert f"waiting for limit {name} since {wait['since']}" in human.stdout
        assert job_trace(rt.store, job_id)["waiting_for_limit"] == wait
        # the log holds the call that runs, nothing of the one that waits
        events = rt.store.list_events(job_id)
        assert [e.type for e in events].count("tool_invocation_started") == 1
        assert not any(name in json.dumps(e.payload) and "limit_grant" not in e.payload
                       for e in events)  # fmt: skip
    # granted, then done: nothing shown, no row left
    store = open_store(store_url)
    try:
        assert waiting_for_limit(store, job_id, now_s=time.time()) is None
        assert "waiting_for_limit" not in job_trace(store, job_id)
        shown = cli("jobs", "show", job_id, "--json", "--db", store_url)
        assert "waiting_for_limit" not in json.loads(shown.stdout)
        assert wait_rows(store) == 0
    finally:
        store.close()


def test_the_wait_of_a_claim_that_is_over_is_not_shown(store_url: str) -> None:
    with one_call_waiting(store_url) as (rt, job_id, _):
        with rt.store.transaction(durable=False) as tx:  # as if its worker died: lease over
            tx.execute("UPDATE jobs SET lease_expires_at = 0 WHERE job_id = ?", (job_id,))
        assert waiting_for_limit(rt.store, job_id, now_s=time.time()) is None
        assert "waiting_for_limit" not in job_trace(rt.store, job_id)
        with rt.store.transaction(durable=False) as tx:  # (the runner's heartbeat goes on)
            tx.execute(
                "UPDATE jobs SET lease_expires_at = ? WHERE job_id = ?", (time.time() + 60, job_id)
            )


def _registry(limit: Limit, tool_name: str = "held") -> ToolRegistry:
    return ToolRegistry([Tool(tool_name, lambda ctx: ctx.node_id, "tool", limit=limit)])


def _use(url: str, limit: Limit) -> None:
    """One job whose call takes a grant of ``limit``, run by a worker declaring it."""
    with Runtime(url, tools=_registry(limit)) as rt:
        rt.submit(plan(node("a", "held")), {})
        rt.run_until_idle()


def test_a_conflicting_declaration_is_refused_at_worker_start(store_url: str) -> None:
    _use(store_url, Limit(rate="3/1s", concurrency=2, name="shared"))
    store = open_store(store_url)
    try:
        other = Worker(store, _registry(Limit(concurrency=3, name="shared")), lease_seconds=5)
        with pytest.raises(ConfigError) as refused:
            other.run(until_idle=True)
        assert "limit 'shared' is in use as rate 3 per 1s, concurrency 2" in str(refused.value)
        assert "concurrency 3" in str(refused.value) and "same --tools" in refused.value.hint
        # nothing changed: the limit is still declared as it was used
        with store.transaction(durable=False) as tx:
            (usage,) = tx.limit_usage(now_us=time.time_ns() // 1000)
        assert (usage.rate_count, usage.concurrency) == (3, 2)
        # the same declaration starts
        Worker(store, _registry(Limit(rate="3/1s", concurrency=2, name="shared"))).run(
            until_idle=True
        )
        # a limit idle for long enough takes a new declaration (a redeploy)
        with store.transaction(durable=False) as tx:
            tx.execute("UPDATE limit_state SET last_granted_us = 0 WHERE name = 'shared'")
        other.run(until_idle=True)
        with store.transaction(durable=False) as tx:
            (usage,) = tx.limit_usage(now_us=time.time_ns() // 1000)
        assert (usage.rate_count, usage.concurrency) == (None, 3)
    finally:
        store.close()


def test_two_tools_declaring_one_limit_differently_are_refused(store_url: str) -> None:
    tools = ToolRegistry(
        [
            Tool("one", lambda ctx: 1, "tool", limit=Limit(concurrency=1, name="pair")),
            Tool("two", lambda ctx: 2, "tool", limit=Limit(concurrency=2, name="pair")),
        ]
    )
    store = open_store(store_url)
    try:
        with pytest.raises(ConfigError, match="limit 'pair' is declared twice"):
            Worker(store, tools).run(until_idle=True)
    finally:
        store.close()


def test_the_worker_command_refuses_a_conflicting_declaration(
    store_url: str, tmp_path: Path
) -> None:
    _use(store_url, Limit(rate="3/1s", concurrency=2, name="cli-shared"))
    tools = tmp_path / "other_tools.py"
    tools.write_text(
        textwrap.dedent(
            """
            import affidavit

            @affidavit.tool("other", limit=affidavit.Limit(concurrency=5, name="cli-shared"))
            def other(ctx):
                return 1
            """
        )
    )
    done = cli_process("worker", "--db", store_url, "--tools", str(tools), "--until-idle")
    assert done.returncode == 3, (done.stdout, done.stderr)
    err: Any = done.stderr
    assert "limit 'cli-shared' is in use" in err and "--tools" in err
