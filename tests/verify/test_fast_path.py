"""Property: LogFold's fast paths decide exactly what its handlers decide.

``LogFold.feed_all`` accepts the common step events inline and hands everything else to the
event's handler; ``LogFold(fast_paths=False)`` sends every event to its handler. On well-formed
logs and on logs broken in many small ways (events dropped, repeated, moved, retyped; fields
removed, swapped for another event's value or for a value of the wrong type; payloads that are
not objects or not JSON; results whose sorted-key and JCS forms differ) both must end in the
same state: the same first violation, ledger findings, chain, execution hash and replay state.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit import Runtime
from affidavit.core.canonical import canonical
from affidavit.examples import refund
from affidavit.verify._fold import LogFold
from tests.verify.agent_log import refund_agent_log
from tests.verify.helpers import Event, Log, refund_job, rows, synthetic_log

_DELETE = object()

STEP_TYPES = [
    "node_started",
    "tool_invocation_started",
    "tool_invocation_finished",
    "command_committed",
    "node_finished",
]
OTHER_TYPES = ["state_changed", "job_waiting", "job_completed", "job_failed", "plan_generated"]
FIELDS = [
    "node_id",
    "step_id",
    "idempotency_key",
    "invocation_id",
    "command_id",
    "result_hash",
    "result",
    "outcome",
    "result_type",
    "tool_name",
    "args_hash",
]
ODD_VALUES: list[Any] = [None, 0, 1.5, True, "x", [], {}, ["a"], {"a": 1}, _DELETE]
FRESH: list[Any] = ["new-1", "new-2", 7, "failure", "pure", "side_effect_committed", None, []]
STEP_FIELDS = {
    "node_started": (),
    "tool_invocation_started": ("invocation_id", "idempotency_key", "tool_name", "args_hash"),
    "tool_invocation_finished": ("invocation_id", "idempotency_key", "outcome", "result"),
    "command_committed": ("command_id", "idempotency_key", "result_hash"),
    "node_finished": ("result_type",),
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Log]]:
    """The synthetic log, a real refund job's log and an agent job's log."""
    tmp = tmp_path_factory.mktemp("fast_path")
    with Runtime(f"sqlite:///{tmp / 'a.db'}", tools=refund.TOOLS, signing_key=tmp / "k") as rt:
        job_id = refund_job(rt, tmp / "shop")
        real = [
            {"type": e.type, "payload": orjson.loads(e.payload_bytes)}
            for e in rt.store.list_events(job_id)
        ]
    agent = refund_agent_log()
    recorded = [{"type": t, "payload": p} for t, p in agent.events]
    yield [synthetic_log(), (job_id, real), (agent.job_id, recorded)]


def values(events: list[Event], field: str) -> list[Any]:
    """The values ``field`` has in the log's payloads."""
    return [e["payload"][field] for e in events if field in _fields(e)]


def step_pairs(events: list[Event]) -> list[tuple[Any, Any]]:
    """The distinct ``(node_id, step_id)`` pairs of the log's step events."""
    pairs = {
        orjson.dumps([e["payload"]["node_id"], e["payload"].get("step_id")])
        for e in events
        if "node_id" in _fields(e)
    }
    return [tuple(orjson.loads(pair)) for pair in sorted(pairs)] or [("a", "b")]


def _fields(event: Event) -> dict[str, Any]:
    return event["payload"] if isinstance(event["payload"], dict) else {}


@st.composite
def mutated(draw: st.DrawFn, logs: list[Log]) -> Log:
    job_id, original = draw(st.sampled_from(logs), label="log")
    events = copy.deepcopy(original)
    for _ in range(draw(st.integers(0, 4), label="mutations")):
        i = draw(st.integers(0, len(events) - 1), label="at")
        op = draw(st.sampled_from(["delete", "repeat", "move", "retype", "insert", "field", "raw"]))
        if op == "delete" and len(events) > 1:
            del events[i]
        elif op == "repeat":
            events.insert(draw(st.integers(0, len(events))), copy.deepcopy(events[i]))
        elif op == "move":
            events.insert(draw(st.integers(0, len(events) - 1)), events.pop(i))
        elif op == "retype":
            events[i]["type"] = draw(st.sampled_from(STEP_TYPES + OTHER_TYPES))
        elif op == "insert":  # a new step event about any node, its fields from the log or new
            event_type = draw(st.sampled_from(STEP_TYPES), label="type")
            node_id, step_id = draw(st.sampled_from(step_pairs(events)), label="node")
            payload: dict[str, Any] = {"node_id": node_id, "step_id": step_id}
            for field in STEP_FIELDS[event_type]:
                seen = values(events, field)
                choices = st.sampled_from(FRESH) | st.sampled_from(seen) if seen else st.just(None)
                payload[field] = draw(choices, label=field)
            events.insert(
                draw(st.integers(0, len(events)), label="to"),
                {"type": event_type, "payload": payload},
            )
        elif op == "raw":
            events[i]["payload"] = draw(st.sampled_from([b"[1]", b"{", b"{}", b'"x"']))
        elif isinstance(events[i]["payload"], dict):
            field = draw(st.sampled_from(FIELDS), label="field")
            value = draw(st.sampled_from(values(events, field) + ODD_VALUES), label="value")
            if value is _DELETE:
                events[i]["payload"].pop(field, None)
            else:
                events[i]["payload"][field] = value
            if field == "result" and draw(st.booleans(), label="rehash as sorted orjson"):
                # the hash of orjson's sorted-key bytes, not of the JCS bytes (differs for 5.0)
                events[i]["payload"]["result"] = {"x": 5.0}
                for e in events:
                    if isinstance(e["payload"], dict) and e["type"] == "command_committed":
                        data = orjson.dumps({"x": 5.0}, option=orjson.OPT_SORT_KEYS)
                        e["payload"]["result_hash"] = hashlib.sha256(data).hexdigest()
    return job_id, events


def outcome(fold: LogFold) -> dict[str, Any]:
    fold.finish()
    return {
        "replay_error": fold.replay_error,
        "ledger_errors": fold.ledger_errors,
        "chain": (fold.root, fold.count, fold.first_bad_version),
        "execution_hash": fold.execution_hash(),
        "log_status": fold.log_status,
        "terminal_version": fold.terminal_version,
        "completed": fold.completed,
        "committed": fold.committed,
        "committed_nodes": fold.committed_nodes,
        "invocation_ids": fold.invocation_ids,
        "open_invocations": list(fold.open_invocations.items()),
        "open_by_key": list(fold.open_by_key.items()),  # its order is the pending keys' order
        "success": fold.success,
        "started": fold.started,
        "waits": (fold.waits, fold.answered, fold.parked),
        "agent": (fold.next_seq, fold.failed_nodes, fold.wait_payloads),
    }


def run(log: Log, *, fast_paths: bool) -> dict[str, Any]:
    job_id, events = log
    fold = LogFold(job_id, fast_paths=fast_paths)
    fold.feed_all(rows(events))
    return outcome(fold)


def test_the_logs_verify(logs: list[Log]) -> None:
    for log in logs:
        fast = run(log, fast_paths=True)
        assert fast["replay_error"] is None and not fast["ledger_errors"]
        assert fast["log_status"] == "completed"
        assert fast == run(log, fast_paths=False)


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fast_paths_agree_with_the_handlers(logs: list[Log], data: st.DataObject) -> None:
    log = data.draw(mutated(logs))
    assert run(log, fast_paths=True) == run(log, fast_paths=False)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_payloads_given_parsed_agree_with_parsing_them(
    logs: list[Log], data: st.DataObject
) -> None:
    """``feed_all(rows, parsed)`` — the payloads handed in already parsed, as the pack verifier
    does — ends where parsing each row's bytes ends, on mutated logs too."""
    log = data.draw(mutated(logs))
    job_id, events = log
    event_rows = list(rows(events))
    parsed = []
    for row in event_rows:
        try:
            parsed.append(orjson.loads(row[3]))
        except orjson.JSONDecodeError:
            return  # not JSON: no parser hands such a payload in parsed
    fold = LogFold(job_id)
    fold.feed_all(event_rows, parsed)
    assert outcome(fold) == run(log, fast_paths=True)


def test_one_event_at_a_time_agrees(logs: list[Log]) -> None:
    """``feed`` (one event per call, as a streaming caller may use it) ends where
    ``feed_all`` ends."""
    job_id, events = logs[0]
    fold = LogFold(job_id)
    for row in rows(events):
        fold.feed(*row)
    assert outcome(fold) == run(logs[0], fast_paths=True)


def test_payload_bytes_need_not_be_canonical(logs: list[Log]) -> None:
    """The fold reads whatever bytes were stored: a valid payload that is not canonical is a
    matter for the chain, not for the replay."""
    job_id, events = copy.deepcopy(logs[0])
    index = next(i for i, e in enumerate(events) if e["type"] == "node_started")
    events[index]["payload"] = b" " + canonical(events[index]["payload"])
    log = (job_id, events)
    assert run(log, fast_paths=True) == run(log, fast_paths=False)
    assert run(log, fast_paths=True)["replay_error"] is None


def _distinct(items: list[Any]) -> list[Any]:
    seen: dict[bytes, Any] = {}
    for item in items:
        seen.setdefault(orjson.dumps(item, option=orjson.OPT_SORT_KEYS), item)
    return list(seen.values())


def _insertions(log: Log, event_type: str) -> Iterator[dict[str, Any]]:
    """Every payload of ``event_type`` about a node of the log whose fields are each one of a
    few telling values: new ones, the log's own (of this or another node), an unknown one."""
    _, events = log
    choices: dict[str, list[Any]] = {
        "invocation_id": ["new-1", *_distinct(values(events, "invocation_id"))],
        "command_id": ["new-1", *_distinct(values(events, "command_id"))],
        "idempotency_key": ["new-key", *_distinct(values(events, "idempotency_key"))],
        "outcome": ["success", "bogus"],
        "result": _distinct(values(events, "result"))[-1:],
        "result_hash": _distinct(values(events, "result_hash"))[-2:],
        "result_type": ["pure", "side_effect_committed", "failed", "bogus"],
        "tool_name": _distinct(values(events, "tool_name")),  # (the node's own, or another's)
        "args_hash": _distinct(values(events, "args_hash"))[-2:],
    }
    if event_type == "command_committed":
        choices["idempotency_key"].append(None)
    pairs = step_pairs(events)
    if event_type == "node_started":
        pairs.append((pairs[0][0], "0" * 16))  # a wrong step id
    combos: list[dict[str, Any]] = [{}]
    for field in STEP_FIELDS[event_type]:
        combos = [{**c, field: v} for c in combos for v in choices[field]]
    for node_id, step_id in pairs:
        for combo in combos:
            yield {"node_id": node_id, "step_id": step_id, **combo}


@pytest.mark.parametrize("event_type", STEP_TYPES)
def test_fast_paths_agree_on_every_single_insertion(logs: list[Log], event_type: str) -> None:
    """One extra step event, of every telling shape, at every position of the synthetic log:
    each check of a fast path is what stops some such event, so none goes untried."""
    job_id, events = logs[0]
    base = rows(events)
    tried = 0
    for payload in _insertions(logs[0], event_type):
        row = (0, "extra", event_type, orjson.dumps(payload), None)
        for position in range(len(base) + 1):
            log_rows = [*base[:position], row, *base[position:]]
            results = []
            for fast_paths in (True, False):
                fold = LogFold(job_id, fast_paths=fast_paths)
                fold.feed_all(log_rows)
                results.append(outcome(fold))
            assert results[0] == results[1], (position, payload)
            tried += 1
    assert tried > len(base)


def test_fast_paths_agree_on_a_key_committed_twice(logs: list[Log]) -> None:
    """A second invocation of a key, started before the key's commit and finished after it,
    then committed too: refused on both paths where it starts (between a success and its
    commit, which the runtime writes in one transaction); a commit repeated is refused
    (committed_once) on both paths."""
    job_id, original = logs[0]
    events = copy.deepcopy(original)
    finished = next(i for i, e in enumerate(events) if e["type"] == "tool_invocation_finished")
    first = events[finished]["payload"]
    again = {k: first[k] for k in ("node_id", "step_id", "idempotency_key")}
    again["invocation_id"] = "again"
    start = events[finished - 1]["payload"]
    events.insert(
        finished + 1,
        {
            "type": "tool_invocation_started",
            "payload": {**again, "tool_name": start["tool_name"], "args_hash": start["args_hash"]},
        },
    )
    commit = next(i for i, e in enumerate(events) if e["type"] == "command_committed")
    events[commit + 1 : commit + 1] = [
        {
            "type": "tool_invocation_finished",
            "payload": {**again, "outcome": "success", "result": first["result"]},
        },
        {
            "type": "command_committed",
            "payload": {**events[commit]["payload"], "command_id": "again"},
        },
    ]
    fast, slow = run((job_id, events), fast_paths=True), run((job_id, events), fast_paths=False)
    assert fast == slow
    assert fast["replay_error"][:2] == ("commit_evidence", finished + 2)
    events = copy.deepcopy(original)
    commit = next(i for i, e in enumerate(events) if e["type"] == "command_committed")
    events.insert(commit + 1, copy.deepcopy(events[commit]))
    fast, slow = run((job_id, events), fast_paths=True), run((job_id, events), fast_paths=False)
    assert fast == slow
    assert fast["replay_error"][:2] == ("committed_once", commit + 2)
