"""The replay context: deterministic, refuses impossible logs, and — a property over random
task graphs with crashes at random points, on SQLite and PostgreSQL — resuming from the log
never calls a committed tool again nor re-runs a finished pure step (G1, G3)."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import affidavit.core.crash as crash_module
from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.canonical import canonical
from affidavit.core.errors import ReplayError
from affidavit.record._replay import ReplayContextBuilder, build_from_events
from affidavit.store import StoredEvent
from tests.runtime.helpers import SimulatedCrash, assert_log_sound, node, plan

# --- a real log to start from -----------------------------------------------------------------

GRAPH = plan(
    node("a", "act"),
    node("b", "think", "pure", args={"x": "${a}"}, deps=["a"]),
    {"id": "w", "type": "approval", "depends_on": ["b"]},
    node("c", "act", args={"y": "${b}"}, deps=["w"]),
)


def real_log(store_url: str) -> list[StoredEvent]:
    def act(ctx: ToolContext, **args: Any) -> dict[str, Any]:
        return {"did": ctx.node_id}

    def think(ctx: ToolContext, x: Any) -> dict[str, Any]:
        return {"thought": x}

    tools = ToolRegistry([Tool("act", act, "tool"), Tool("think", think, "pure")])
    with Runtime(store_url, tools=tools) as rt:
        job_id = rt.submit(GRAPH, {}).job_id
        rt.run_until_idle()
        rt.signal(job_id, f"{job_id}:w", {"approved": True}, approver="ann")
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        return rt.store.list_events(job_id)


@pytest.fixture
def log(store_url: str) -> list[StoredEvent]:
    return real_log(store_url)


def _scanned_output(ctx: Any, node_id: str) -> Any:
    """``node_output`` by its definition: a node's own output, else the result of its first
    committed invocation in log order."""
    finished = ctx.node_finished[node_id]
    if "output" in finished:
        return finished["output"]
    return next(
        (i.result for i in ctx.invocations.values() if i.node_id == node_id and i.committed), None
    )


def test_node_output_agrees_with_scanning_every_invocation(log: list[StoredEvent]) -> None:
    """``node_output`` looks the node's invocations up (a resumed run asks it for every
    completed node); the lookup follows invocations added after an earlier call."""
    builder = ReplayContextBuilder()
    seen = 0
    for stored in log:
        builder.add(stored)
        ctx = builder.ctx
        for node_id in ctx.completed_nodes:  # asked after every event: the index must follow
            assert ctx.node_output(node_id) == _scanned_output(ctx, node_id)
            seen += 1
    assert seen > 0
    assert ctx.node_output("a") == {"did": "a"} and ctx.node_output("c") == {"did": "c"}


def test_context_is_deterministic_and_complete(log: list[StoredEvent]) -> None:
    first = ReplayContextBuilder.build_from_events(log)
    second = build_from_events(list(log))
    assert first == second
    assert first.status == "completed"
    assert first.completed_nodes == {"a", "b", "w", "c"}
    assert len(first.completed_tool_invocations) == 2
    assert not first.pending_tool_invocations
    assert len(first.completed_command_ids) == 2
    assert first.approved_keys == {f"{first.job_id}:w"}
    assert first.node_output("b") == {"thought": {"did": "a"}}
    assert first.event_count == len(log)
    # every prefix is a state the log went through: it builds, and deterministically
    for n in range(1, len(log) + 1):
        assert build_from_events(log[:n]) == build_from_events(log[:n])


# --- impossible logs --------------------------------------------------------------------------


def edit(e: StoredEvent, type: str | None = None, **payload: Any) -> StoredEvent:
    """``e`` with fields of its payload replaced (``None`` removes one) or its type changed."""
    body = {k: v for k, v in {**e.payload, **payload}.items() if v is not None}
    return dataclasses.replace(e, type=type or e.type, payload_bytes=canonical(body))


def renumber(events: list[StoredEvent]) -> list[StoredEvent]:
    return [dataclasses.replace(e, version=i) for i, e in enumerate(events, 1)]


def index(log: list[StoredEvent], type: str, node_id: str | None = None, nth: int = 0) -> int:
    found = [
        i
        for i, e in enumerate(log)
        if e.type == type and (node_id is None or e.payload.get("node_id") == node_id)
    ]
    return found[nth]


Mutation = Callable[[list[StoredEvent]], tuple[list[StoredEvent], int]]


def _unknown_node(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    i = index(log, "node_finished", "b")
    log[i] = edit(log[i], node_id="zz")
    return log, i + 1


def _wrong_step_id(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    i = index(log, "node_finished", "b")
    log[i] = edit(log[i], step_id="0000000000000000")
    return log, i + 1


def _before_dependency(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    started_c = log[index(log, "node_started", "c")]
    log.insert(2, started_c)
    return renumber(log), 3


def _started_after_commit(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    again = log[index(log, "tool_invocation_started", "a")]
    i = index(log, "node_started", "c")
    log.insert(i, again)
    return renumber(log), i + 1


def _finished_without_start(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    del log[index(log, "tool_invocation_started", "a")]
    return renumber(log), index(log, "tool_invocation_finished", "a") + 1


def _committed_twice(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    i = index(log, "command_committed", "a")
    log.insert(i + 1, log[i])
    return renumber(log), i + 2


def _after_terminal(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    log.append(log[index(log, "node_started", "c")])
    return renumber(log), len(log)


def _version_gap(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    del log[3]
    return log, 5


def _no_job_created(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    return renumber(log[1:]), 1


def _unknown_wait_key(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    i = index(log, "wait_completed")
    log[i] = edit(log[i], correlation_key="someone-else:w")
    return log, i + 1


def _resumed_not_parked(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    i = index(log, "wait_completed")
    log[i] = edit(
        log[i],
        type="job_resumed",
        decision="continue",
        by=None,
        node_id=None,
        correlation_key=None,
        payload=None,
        signalled_by=None,
    )
    return log, i + 1


def _unknown_type(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    i = index(log, "node_started", "b")
    log[i] = edit(log[i], type="node_teleported")
    return log, i + 1


def _malformed(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    i = index(log, "node_finished", "b")
    log[i] = edit(log[i], node_id=None)
    return log, i + 1


def _second_plan(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    log.insert(3, log[1])
    return renumber(log), 4


def _other_job(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    log[4] = dataclasses.replace(log[4], job_id="another-job")
    return log, 5


def _committed_without_commit(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    del log[index(log, "command_committed", "a")]
    return renumber(log), index(log, "node_finished", "a") + 1


def _finished_twice(log: list[StoredEvent]) -> tuple[list[StoredEvent], int]:
    i = index(log, "node_finished", "b")
    log.insert(i + 1, log[i])
    return renumber(log), i + 2


IMPOSSIBLE: dict[str, tuple[Mutation, str]] = {
    "unknown_node": (_unknown_node, "not in the plan"),
    "wrong_step_id": (_wrong_step_id, "is not the plan's"),
    "started_before_its_dependency": (_before_dependency, "before its dependency"),
    "tool_started_after_commit": (_started_after_commit, "after it completed"),
    "finished_without_start": (_finished_without_start, "never started"),
    "committed_twice": (_committed_twice, "committed twice"),
    "event_after_the_end": (_after_terminal, "after the job was completed"),
    "version_gap": (_version_gap, "versions run"),
    "no_job_created": (_no_job_created, "does not start with job_created"),
    "wait_completed_for_unknown_key": (_unknown_wait_key, "nobody waits for"),
    "resumed_without_park": (_resumed_not_parked, "not parked"),
    "unknown_event_type": (_unknown_type, "unknown event type"),
    "malformed_payload": (_malformed, "malformed node_finished"),
    "second_plan": (_second_plan, "a second plan_generated"),
    "event_of_another_job": (_other_job, "belongs to job"),
    "side_effect_without_commit": (_committed_without_commit, "without a commit"),
    "node_finished_twice": (_finished_twice, "after it completed"),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE))
def test_impossible_log_is_refused_naming_the_version(log: list[StoredEvent], case: str) -> None:
    mutate, message = IMPOSSIBLE[case]
    broken, version = mutate(list(log))
    with pytest.raises(ReplayError) as caught:
        build_from_events(broken)
    assert caught.value.version == version, caught.value.message
    assert message in caught.value.message
    assert caught.value.message.startswith(f"event {version}: ")


# --- property: random task graphs, crashes at random points ------------------------------------


@st.composite
def task_graphs(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(1, 6))
    nodes = []
    for i in range(count):
        kind = draw(st.sampled_from(["tool", "pure"]))
        deps = [f"n{j}" for j in range(i) if draw(st.booleans())]
        nodes.append(
            node(f"n{i}", f"p_{kind}", kind, args={"deps": [f"${{{d}}}" for d in deps]}, deps=deps)
        )
    return plan(*nodes)


class Property:
    """Tools that count what really happened, and crash points that die on cue."""

    def __init__(self, rt_store: Any) -> None:
        self.store = rt_store
        self.world: dict[str, dict[str, Any]] = {}  # external key -> effect (the "payments")
        self.effects: Counter[tuple[str, str]] = Counter()
        self.pure_after_finish: list[tuple[str, str]] = []
        self.hits = 0
        self.crash_at: set[int] = set()
        self.lock = threading.Lock()

    def tool(self, ctx: ToolContext, deps: list[Any]) -> dict[str, Any]:
        result = {"node": ctx.node_id, "key": ctx.external_key, "deps": deps}
        with self.lock:
            self.world[ctx.external_key] = result
            self.effects[(ctx.job_id, ctx.node_id)] += 1
        return result

    def reconcile(self, ctx: ToolContext, deps: list[Any]) -> dict[str, Any] | None:
        return self.world.get(ctx.external_key)

    def pure(self, ctx: ToolContext, deps: list[Any]) -> dict[str, Any]:
        done = build_from_events(self.store.list_events(ctx.job_id)).completed_nodes
        if ctx.node_id in done:
            self.pure_after_finish.append((ctx.job_id, ctx.node_id))
        return {"node": ctx.node_id, "deps": deps}

    def crash_point(self, name: str) -> None:
        with self.lock:
            self.hits += 1
            crash = self.hits in self.crash_at
        if crash:
            raise SimulatedCrash(name)


@pytest.fixture
def prop(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Runtime, Property]]:
    holder: list[Property] = []
    tool = Tool("p_tool", lambda ctx, **a: holder[0].tool(ctx, **a), "tool")
    tool.reconcile(lambda ctx, **a: holder[0].reconcile(ctx, **a))
    pure = Tool("p_pure", lambda ctx, **a: holder[0].pure(ctx, **a), "pure")
    with Runtime(store_url, tools=ToolRegistry([tool, pure]), lease_seconds=30) as rt:
        holder.append(Property(rt.store))
        monkeypatch.setattr(crash_module, "crash_point", lambda n: holder[0].crash_point(n))
        yield rt, holder[0]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    graph=task_graphs(),
    crashes=st.sets(st.integers(1, 10), min_size=1, max_size=3),
    step_concurrency=st.sampled_from([1, 3]),
)
def test_resuming_from_the_log_never_repeats_work(
    prop: tuple[Runtime, Property], graph: dict[str, Any], crashes: set[int], step_concurrency: int
) -> None:
    """Also with independent nodes running at the same time (``step_concurrency`` 3)."""
    rt, p = prop
    p.hits, p.crash_at = 0, crashes
    rt.worker.step_concurrency = step_concurrency
    job_id = rt.submit(graph, {}).job_id
    died = 0
    for _ in range(len(crashes) + 1):
        try:
            rt.worker.run_once(job_id)
        except SimulatedCrash:
            died += 1
            # the worker "died": let its lease run out now instead of waiting for it
            job = rt.get_job(job_id)
            with rt.store.transaction(durable=False) as tx:
                tx.set_lease(
                    job_id, attempt_id=job.attempt_id, owner=job.lease_owner, expires_at=0.0
                )
            continue
        break
    event(f"runs that died: {died}")
    job = rt.get_job(job_id)
    assert job.status == "completed", (job.status, job.error)
    tools = [n["id"] for n in graph["nodes"] if n["type"] == "tool"]
    assert {n: p.effects[(job_id, n)] for n in tools} == {n: 1 for n in tools}  # G1
    assert not [x for x in p.pure_after_finish if x[0] == job_id]  # G3
    events = assert_log_sound(rt.store, job_id)
    replay = build_from_events(events)
    assert replay == build_from_events(events)
    assert replay.completed_nodes == {n["id"] for n in graph["nodes"]}
    for n in tools:  # every recorded result is the effect that really happened
        recorded = replay.node_output(n)
        assert p.world[recorded["key"]] == recorded
