"""OpenAI Agents SDK sub-agents as child jobs, the edges, with the real SDK on both backends:
an agent tool is a child job only when made by the registered agent itself; a handoff's child
answers in the output type the SDK parses; a handoff cycle ends with the turns the run had; a
run a child job cannot serve (RunConfig(model=...), a conversation the server keeps) is
refused; a retry policy does not start a handoff's child twice; ``agent_job`` registers one
agent once, with its own budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import Agent

import affidavit
from affidavit import Runtime, ToolRegistry
from affidavit.integrations._children import MAX_PROMPT_BYTES, check_prompt
from affidavit.integrations.openai_agents import agent_job
from affidavit.integrations.openai_agents._children import sub_agent_of
from affidavit.store import JobFilter
from affidavit.verify import verify_tree
from tests.integrations import oai_sub_cases as sc
from tests.integrations import oai_sub_tools as st
from tests.integrations.oai_tools import QUIET


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {"OAI_SIDE": str(tmp_path / "side.jsonl"), "OAI_LEDGER": str(tmp_path / "ledger")}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def _runtime(url: str) -> Runtime:
    return Runtime(url, tools=ToolRegistry(sc.REGISTRATIONS), lease_seconds=30)


def _tree(rt: Runtime, root: str) -> list[Any]:
    """Every job under ``root`` (itself excluded), depth first."""
    found = []
    for child in rt.store.list_jobs(JobFilter(parent=root)):
        found += [child, *_tree(rt, child.job_id)]
    return found


def test_an_agent_tool_is_a_child_job_only_from_the_registered_agent_itself() -> None:
    assert sub_agent_of(st.refunder.as_tool("refund", "Refund")) is not None
    clone = st.refunder.clone(instructions="refund twice")
    assert sub_agent_of(clone.as_tool("refund", "Refund")) is None  # (runs in the job)
    namesake = Agent(name="refunder")
    assert sub_agent_of(namesake.as_tool("refund", "Refund")) is None


@pytest.mark.parametrize("job", ["oai_count_front", "oai_count_triage"])
def test_a_child_with_a_wrapped_output_type_answers_the_parent(
    store_url: str, env: Any, job: str
) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit(job, {"prompt": "count"}).job_id
        rt.run_until_idle()
        done = rt.get_job(root)
        assert done.status == "completed", done.error
        [child] = rt.store.list_jobs(JobFilter(parent=root))
        assert child.output == {"final_output": 7}
        # a handoff: the SDK parsed the child's answer as an int; an agent tool: its output
        assert done.output == {"output": 7 if job == "oai_count_front" else "counted 7"}
        assert verify_tree(rt.store, root).ok


def test_a_handoff_cycle_ends_with_the_turns_the_run_had(store_url: str, env: Any) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("oai_pingpong", {"prompt": "go"}).job_id
        rt.run_until_idle()
        done = rt.get_job(root)
        assert done.status == "failed"
        assert "'oai_ping' ended failed: Max turns (1) exceeded" in str(done.error)
        # ping (1 turn, in the job) -> pong (a child given 2) -> ping (a child given 1)
        assert [(j.plan_name, j.status) for j in _tree(rt, root)] == [
            ("oai_pong", "failed"),
            ("oai_ping", "failed"),
        ]
        created = rt.store.list_events(_tree(rt, root)[1].job_id, limit=1)[0].payload
        assert created["input"]["max_turns"] == 1


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("model_handoff", "a handoff to 'refunder', a child job"),
        ("model_tool", "the agent tool 'refund' of 'refunder', a child job"),
        ("previous_response_id", "the server keeps"),
        ("conversation_id", "the server keeps"),
    ],
)
def test_a_run_a_child_job_cannot_serve_is_refused(
    store_url: str, env: Any, case: str, says: str
) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("oai_refused", {"case": case}).job_id
        rt.run_until_idle()
        done = rt.get_job(root)
        assert done.status == "failed"
        assert says in str(done.error), done.error
        assert rt.store.list_jobs(JobFilter(parent=root)) == []  # no child was started


def test_a_retry_policy_does_not_start_a_handoffs_child_twice(store_url: str, env: Any) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("oai_retrying", {"prompt": "fail"}).job_id
        rt.run_until_idle()
        done = rt.get_job(root)
        assert done.status == "failed"
        [child] = rt.store.list_jobs(JobFilter(parent=root))  # one child, not one per retry
        assert child.status == "failed"


@pytest.mark.parametrize("told", [True, False])
def test_a_failed_child_is_told_by_the_tools_failure_error_function(
    store_url: str, env: Any, told: bool
) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("oai_told_triage", {"prompt": "fail", "told": told}).job_id
        rt.run_until_idle()
        done = rt.get_job(root)
        [child] = rt.store.list_jobs(JobFilter(parent=root))
        assert child.status == "failed"
        if told:  # the model is told what as_tool's function says
            assert done.status == "completed", done.error
            assert done.output == {"output": "noted; no refund (ChildJobFailed)"}
        else:  # None: the SDK raises the tool's error (ChildJobFailed) as its UserError
            assert done.status == "failed"
            assert "Error running tool refund: the child job" in str(done.error), done.error
        assert verify_tree(rt.store, root).ok


def test_agent_job_again_with_other_options_is_refused() -> None:
    assert agent_job(st.refunder, name="oai_refunder", run_config=QUIET) is st.refunder_job
    for options in (
        {"name": "oai_refunder", "run_config": QUIET, "version": "2"},
        {"name": "oai_refunder", "run_config": QUIET, "queue": "slow"},
        {"name": "oai_refunder", "run_config": QUIET, "max_turns": 3},
        {"name": "oai_refunder"},  # (no run_config)
        {"name": "oai_refunder_2", "run_config": QUIET},
    ):
        with pytest.raises(affidavit.ConfigError, match="with other options"):
            agent_job(st.refunder, **options)


def test_a_child_jobs_budget_is_its_own(store_url: str, env: Any) -> None:
    assert (sc.budgeted_job.budget, sc.budgeted_job.in_flight) == (sc.BUDGET, "fail")
    with _runtime(store_url) as rt:
        root = rt.submit("oai_budget_triage", {"prompt": "refund 7"}).job_id
        rt.run_until_idle()
        [child] = rt.store.list_jobs(JobFilter(parent=root))
        events = rt.store.list_events(child.job_id)
        started = next(e.payload for e in events if e.type == "agent_started")
        assert started["budget"] == {"tool_calls": 0}
        assert started["policy"]["in_flight"] == "fail"
        assert (child.status, events[-1].payload["reason"]) == ("parked", "budget_exceeded")
        assert rt.get_job(root).status == "waiting"  # (its own budget, five calls, is not spent)


def test_a_sub_agents_prompt_is_bounded_in_bytes() -> None:
    assert check_prompt("a", "x" * MAX_PROMPT_BYTES)  # (more than 1,000,000 characters)
    with pytest.raises(ValueError, match="bytes"):
        check_prompt("a", "é" * (MAX_PROMPT_BYTES // 2 + 1))


@pytest.mark.parametrize("turns", [0, "3", True])
def test_a_bad_max_turns_in_a_childs_input_fails_it(store_url: str, env: Any, turns: Any) -> None:
    with _runtime(store_url) as rt:
        job = rt.submit("oai_refunder", {"input": "refund 7", "max_turns": turns}).job_id
        rt.run_until_idle()
        done = rt.get_job(job)
        assert done.status == "failed"
        assert "max_turns must be an integer" in str(done.error), done.error
        assert not Path(env["OAI_LEDGER"]).exists()  # nothing refunded
