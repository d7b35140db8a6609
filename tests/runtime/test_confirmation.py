"""Confirmation replay (G4), on SQLite and PostgreSQL, against real worlds: a file, an HTTP
resource on a loopback server, a SQL row.

The job commits a tool step that changes the world, then waits for an approval. While it
waits, the world is changed behind its back — or not. When the approved job is picked up
again, the recorded change is confirmed before the tool's result is trusted; each
``replay_verification`` mode then does what docs/runtime.md ("Confirmation replay") says. The
tool never runs twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import affidavit.core.crash as crash_module
from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.errors import ConfigError
from affidavit.runtime._confirm import Confirmation, ConfirmationContext
from affidavit.runtime._decisions import InvalidStateError
from affidavit.runtime._sdk import StateChange
from tests.runtime.helpers import (
    Calls,
    SimulatedCrash,
    assert_log_sound,
    ledger_rows,
    node,
    of_type,
    plan,
    wait_lease_expired,
)
from tests.runtime.worlds import FileWorld, HttpWorld, ResourceServer, SqlWorld, World

MODES = ("strict", "warn", "human")
WORLDS = ("file", "http", "sql_row")


def graph(mode: str | None) -> dict[str, Any]:
    settings = {} if mode is None else {"replay_verification": mode}
    return plan(
        node("write", "write"),
        {"id": "ok", "type": "approval", "depends_on": ["write"]},
        node("after", "after", "pure", args={"w": "${write}"}, deps=["ok"]),
        **settings,
    )


@pytest.fixture
def server() -> Iterator[ResourceServer]:
    with ResourceServer() as s:
        yield s


@pytest.fixture
def make_world(store_url: str, tmp_path: Path, server: ResourceServer) -> Callable[[str], World]:
    def make(kind: str) -> World:
        if kind == "file":
            return FileWorld(tmp_path)
        if kind == "http":
            return HttpWorld(server)
        # the rows live in a database of the backend under test (for PostgreSQL, the test's
        # own schema; for SQLite, a file of its own)
        url = store_url if store_url.startswith("postgresql") else f"sqlite:///{tmp_path}/w.db"
        return SqlWorld(url)

    return make


def make_runtime(store_url: str, world: World, calls: Calls, *extra: Tool, **kw: Any) -> Runtime:
    def write(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "write")
        return world.act(ctx)

    def after(ctx: ToolContext, w: Any) -> dict[str, Any]:
        calls.add(ctx, "after")
        return {"saw": w}

    tools = ToolRegistry([Tool("write", write, "tool"), Tool("after", after, "pure"), *extra])
    return Runtime(store_url, tools=tools, verifiers=[world.verifier], lease_seconds=5, **kw)


def approve(rt: Runtime, job_id: str) -> None:
    assert rt.run_until_idle() == 1
    assert rt.get_job(job_id).status == "waiting"
    rt.signal(job_id, f"{job_id}:ok", {"approved": True}, approver="ann")


@pytest.mark.parametrize("kind", WORLDS)
@pytest.mark.parametrize("mode", MODES)
def test_world_unchanged_continues(
    store_url: str, make_world: Any, calls: Calls, mode: str, kind: str
) -> None:
    world = make_world(kind)
    with make_runtime(store_url, world, calls) as rt:
        job_id = rt.submit(graph(mode), {}).job_id
        approve(rt, job_id)
        assert rt.run_until_idle() == 1
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        events = assert_log_sound(rt.store, job_id)
        assert not of_type(events, "confirmation_warning")
        assert not of_type(events, "job_parked")
        assert (calls.count(name="write"), calls.count(name="after")) == (1, 1)
        assert rt.metrics.value("affidavit_confirmations_total", result="match") == 1
        assert rt.metrics.value("affidavit_confirmations_total", result="mismatch") == 0


@pytest.mark.parametrize("kind", WORLDS)
@pytest.mark.parametrize("mode", MODES)
def test_world_changed(store_url: str, make_world: Any, calls: Calls, mode: str, kind: str) -> None:
    world = make_world(kind)
    with make_runtime(store_url, world, calls) as rt:
        job_id = rt.submit(graph(mode), {}).job_id
        approve(rt, job_id)
        world.change()
        assert rt.run_until_idle() == 1
        job = rt.get_job(job_id)
        events = assert_log_sound(rt.store, job_id)
        assert rt.metrics.value("affidavit_confirmations_total", result="mismatch") == 1
        assert calls.count(name="write") == 1  # never re-run, whatever the mode

        if mode == "strict":
            assert job.status == "failed"
            assert job.error["type"] == "replay_verification"
            [mismatch] = job.error["mismatches"]
            assert mismatch["node_id"] == "write"
            assert mismatch["resource"]["resource_type"] == kind
            assert mismatch["reason"] in job.error["message"]
            [failed] = of_type(events, "job_failed")
            assert failed["node_id"] == "write"
            assert calls.count(name="after") == 0
            assert rt.run_until_idle() == 0
            return

        if mode == "warn":
            assert job.status == "completed", job.error
            [warning] = of_type(events, "confirmation_warning")
            assert warning["node_id"] == "write"
            assert warning["resource"]["resource_type"] == kind
            assert "changed" in warning["reason"]
            assert (
                rt.metrics.value("affidavit_confirmation_warnings_total", resource_type=kind) == 1
            )
            assert calls.count(name="after") == 1
            return

        # human: parked until a person decides, holding no lease and no worker
        assert job.status == "parked"
        assert (job.attempt_id, job.lease_owner) == (None, None)
        [parked] = of_type(events, "job_parked")
        assert parked["reason"] == "replay_verification"
        assert parked["node_id"] == "write"
        assert parked["detail"]["mismatches"][0]["resource"]["resource_type"] == kind
        assert rt.run_until_idle() == 0
        assert calls.count(name="after") == 0
        with pytest.raises(InvalidStateError) as refused:
            rt.resume(job_id, "retry")  # that decision is for in-flight invocations
        assert "continue" in refused.value.hint
        rt.resume(job_id, "continue", by="auditor", note="checked: edit was intended")
        assert rt.run_until_idle() == 1
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error  # accepted: not parked again
        assert calls.count(name="write") == 1 and calls.count(name="after") == 1
        assert len(of_type(assert_log_sound(rt.store, job_id), "job_parked")) == 1


def test_human_mode_fail_decision(store_url: str, make_world: Any, calls: Calls) -> None:
    world = make_world("file")
    with make_runtime(store_url, world, calls) as rt:
        job_id = rt.submit(graph("human"), {}).job_id
        approve(rt, job_id)
        world.change()
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "parked"
        job = rt.resume(job_id, "fail", by="auditor")
        assert job.status == "failed"
        assert job.error["type"] == "replay_verification"
        assert rt.run_until_idle() == 0
        assert calls.count(name="after") == 0
        assert_log_sound(rt.store, job_id)


def test_job_level_mode_overrides_the_plan(store_url: str, make_world: Any, calls: Calls) -> None:
    world = make_world("file")
    with make_runtime(store_url, world, calls) as rt:
        job_id = rt.submit(graph("strict"), {}, replay_verification="warn").job_id
        [generated] = of_type(rt.store.list_events(job_id), "plan_generated")
        assert generated["policy"]["replay_verification"] == "warn"
        approve(rt, job_id)
        world.change()
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        assert len(of_type(rt.store.list_events(job_id), "confirmation_warning")) == 1
        with pytest.raises(ConfigError):
            rt.submit(graph(None), {}, replay_verification="lenient")


def test_default_mode_is_strict(store_url: str, make_world: Any, calls: Calls) -> None:
    world = make_world("file")
    with make_runtime(store_url, world, calls) as rt:
        job_id = rt.submit(graph(None), {}).job_id
        approve(rt, job_id)
        world.change()
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "failed"


def test_without_a_verifier_for_the_type_nothing_is_checked(
    store_url: str, make_world: Any, calls: Calls
) -> None:
    world = make_world("file")
    with make_runtime(store_url, world, calls) as rt:
        unchecked = Runtime(
            store=rt.store, tools=ToolRegistry([rt.tools.get("write"), rt.tools.get("after")])
        )
        job_id = unchecked.submit(graph("strict"), {}).job_id
        approve(unchecked, job_id)
        world.change()
        unchecked.run_until_idle()
        assert unchecked.get_job(job_id).status == "completed"
        assert unchecked.metrics.value("affidavit_confirmations_total", result="match") == 0


class Broken:
    resource_types = ("file",)

    def verify(self, ctx: ConfirmationContext, change: StateChange) -> Confirmation:
        raise OSError("disk on fire")


def test_a_verifier_that_raises_is_a_mismatch(store_url: str, tmp_path: Path, calls: Calls) -> None:
    world = FileWorld(tmp_path)
    world.verifier = Broken()
    with make_runtime(store_url, world, calls) as rt:
        job_id = rt.submit(graph("strict"), {}).job_id
        approve(rt, job_id)
        rt.run_until_idle()
        job = rt.get_job(job_id)
        assert job.status == "failed"
        assert "could not check" in job.error["message"] and "disk on fire" in job.error["message"]


def fails_on_pickup(rt: Runtime, job_id: str, world: World) -> None:
    """The run crashes (a simulated crash point), the world changes meanwhile, and the job,
    picked up again once its lease expired, fails on the mismatch (strict)."""
    with pytest.raises(SimulatedCrash):
        rt.run_until_idle()
    world.change()
    wait_lease_expired(rt.store, job_id)
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed" and job.error["type"] == "replay_verification"


def test_confirmation_after_crash_recovery(
    store_url: str, make_world: Any, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job reclaimed after its worker died right after the commit confirms the recorded
    change too: pickup, not only a signal, triggers confirmation."""
    world = make_world("http")
    crashed = [False]

    def crash_point(name: str) -> None:
        if name == "tool.after_commit" and not crashed[0]:
            crashed[0] = True
            raise SimulatedCrash(name)

    monkeypatch.setattr(crash_module, "crash_point", crash_point)
    with make_runtime(
        store_url,
        world,
        calls,
    ) as rt:
        rt.worker.lease_seconds = 0.3
        job_id = rt.submit(
            plan(
                node("write", "write"),
                node("after", "after", "pure", args={"w": "${write}"}, deps=["write"]),
            ),
            {},
        ).job_id
        fails_on_pickup(rt, job_id, world)
        assert calls.count(name="write") == 1 and calls.count(name="after") == 0


def test_a_strict_mismatch_catches_up_what_another_open_invocation_did(
    store_url: str, make_world: Any, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker died after a second tool acted and before its commit; meanwhile the first
    step's world changed. The job fails on the mismatch (strict) — but first the open
    invocation's reconcile hook is asked, as on every other way a job fails on pickup, so the
    effect that happened is in the log as committed, not closed as lost."""
    world = make_world("file")
    effects: dict[str, dict[str, Any]] = {}
    seen = [0]

    def crash_point(name: str) -> None:
        if name == "tool.after_execute":
            seen[0] += 1
            if seen[0] == 2:  # after "charge" acted
                raise SimulatedCrash(name)

    def charge(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "charge")
        assert ctx.idempotency_key is not None
        effects[ctx.idempotency_key] = {"charged": 5}
        return {"charged": 5}

    def found(ctx: ToolContext) -> dict[str, Any] | None:
        assert ctx.idempotency_key is not None
        return effects.get(ctx.idempotency_key)

    charge_tool = Tool("charge", charge, "tool", reconcile_fn=found)
    monkeypatch.setattr(crash_module, "crash_point", crash_point)
    with make_runtime(store_url, world, calls, charge_tool) as rt:
        rt.worker.lease_seconds = 0.3
        job_id = rt.submit(
            plan(node("write", "write"), node("charge", "charge", deps=["write"])), {}
        ).job_id
        fails_on_pickup(rt, job_id, world)
        assert calls.count(name="charge") == 1  # reconciled, never run again
        events = assert_log_sound(rt.store, job_id)
        [caught_up] = [
            p for p in of_type(events, "tool_invocation_finished") if p["node_id"] == "charge"
        ]
        assert caught_up["outcome"] == "success" and caught_up["catch_up"] is True
        charged = [r for r in ledger_rows(rt.store, job_id) if r.node_id == "charge"]
        assert [(r.status, r.result) for r in charged] == [("committed", {"charged": 5})]
