"""The job as an RCE episode (docs/packs.md "The job as an episode"): its steps — ``load_input``,
one per plan node or recorded agent call, ``emit_output`` — the episode contract, and each
step's status and recorded trace.

A node's step status comes from its trace state through the one definition of those states,
:data:`affidavit.record.NODE_STATE_KINDS`: a state added to the trace says there what
it means, and the pack follows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.canonical import canonical, has_exponent_number
from affidavit.packs import _format as F
from affidavit.packs._errors import TraceStateError
from affidavit.record import NODE_STATE_KINDS, AgentOutcome, ReplayContext
from affidavit.store import JobRecord


@dataclass
class Episode:
    """The steps of the pack: their ids, dependencies and the plan nodes behind them."""

    step_of: dict[str, str]  # node id -> step id
    node_by_step: dict[str, dict[str, Any]]
    deps_of: dict[str, list[str]]  # node step id -> its dependencies' step ids
    sinks: list[str]  # the steps emit_output depends on
    script_steps: list[dict[str, Any]] = field(default_factory=list)


def passes(node: dict[str, Any]) -> bool:
    """Whether a traced node is a PASS step: completed (by :data:`NODE_STATE_KINDS`), with its
    output recorded."""
    return NODE_STATE_KINDS.get(node["state"]) == "completed" and "output" in node


def episode_of(trace: dict[str, Any]) -> Episode:
    nodes: list[dict[str, Any]] = trace["nodes"]
    agent = trace.get("kind") == "agent"
    if agent:
        # an agent job's steps depend on the input only (none blocks another: the agent may
        # have caught a failure and gone on); its output on every step that passed
        step_of = {
            n["id"]: F.agent_pack_step_id(n["seq"], str(n["step_id"]), len(nodes)) for n in nodes
        }
    else:
        step_of = {n["id"]: str(n["step_id"]) for n in nodes}
    deps_of = {step_of[n["id"]]: [step_of[d] for d in n["depends_on"]] for n in nodes}
    if agent:
        sinks = [step_of[n["id"]] for n in nodes if passes(n)]
    else:
        has_children = {d for ds in deps_of.values() for d in ds}
        sinks = sorted(s for s in deps_of if s not in has_children)
    episode = Episode(step_of, {step_of[n["id"]]: n for n in nodes}, deps_of, sinks)
    episode.script_steps = _script_steps(episode, nodes)
    return episode


def _script_steps(episode: Episode, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {
            "step_id": F.LOAD_STEP_ID,
            "opcode": "LOAD_INPUT",
            "params": {"ref": F.INPUT_REF},
            "depends_on": [],
        }
    ]
    for n in nodes:
        sid = episode.step_of[n["id"]]
        steps.append(
            {
                "step_id": sid,
                "opcode": "APPLY_TRANSFORM",
                "params": {"transform": f"{n['type']}:{n.get('tool') or ''}"},
                "depends_on": episode.deps_of[sid] or [F.LOAD_STEP_ID],
            }
        )
    steps.append(
        {
            "step_id": F.EMIT_STEP_ID,
            "opcode": "EMIT_OUTPUT",
            "params": {"claim_type": "job_output", "output_ref": "output.json"},
            "depends_on": episode.sinks or [F.LOAD_STEP_ID],
        }
    )
    return steps


def contract_of(
    job: JobRecord,
    input_bytes: bytes,
    script_steps: list[dict[str, Any]],
    tool_versions: dict[str, str],
) -> dict[str, Any]:
    """The episode contract of ``job``."""
    environment: dict[str, Any] = {
        "provider": "none",
        "model_id": "none",
        "tool_versions": tool_versions,
        "container_digest": None,
    }
    environment["env_fingerprint_hash"] = F.h(F.env_fingerprint_input(environment))
    return {
        "schema_version": "rce/0.1",
        "episode_id": "ep_" + F.sha256_hex(str(job.job_id).encode())[:24],
        "objective": str(job.plan_name or f"affidavit job {job.job_id}"),
        "inputs": [
            {"ref": F.INPUT_REF, "hash": F.prefixed(input_bytes), "media_type": "application/json"}
        ],
        "replay_script": {"schema_version": "replay_script/0.1", "steps": script_steps},
        "replay_policy": {"replay_basis": "recorded_trace", "comparator_tier": "A"},
        "environment": environment,
    }


def _completed(node: dict[str, Any], job_status: str) -> tuple[str, Any, int]:
    if "output" not in node:  # (every completed node of a trace carries its output)
        raise TraceStateError(f"node {node['id']!r} is {node['state']} without an output")
    return "PASS", node["output"], _ms(node.get("duration_ms"))


def _ended(node: dict[str, Any], job_status: str) -> tuple[str, Any, int]:
    """A node that failed, or that the job ended without finishing (a FAIL step either way):
    what its last try recorded, or — never started — that it did not run."""
    if node["state"] == "failed" or node.get("started_at") is not None:
        trace = {"outcome": node.get("outcome"), "error": node.get("error")}
        return "FAIL", trace, _ms(node.get("duration_ms"))
    # Never started, with no failed dependency: the job ended first.
    return "FAIL", {"outcome": "not_run", "job_status": job_status}, 0


# Each kind of trace state (NODE_STATE_KINDS) -> the step status and trace of such a node of a
# finished job whose dependencies passed. A compensated node ("undone": its call failed, its
# compensation ran) is a FAIL step with the outcome `compensated`; an "open" node of a finished
# job — the job ended while the node was in flight, waiting or running — is a FAIL step too.
STATE_KIND_STEPS: dict[str, Callable[[dict[str, Any], str], tuple[str, Any, int]]] = {
    "completed": _completed,
    "undone": _ended,
    "failed": _ended,
    "open": _ended,
    "not_run": _ended,
}


def node_step(node: dict[str, Any], job_status: str) -> tuple[str, Any, int]:
    """The step status, recorded trace and duration (ms) of a node whose dependencies passed.

    Raises:
        TraceStateError: the node's state is not one of the trace's states.
    """
    kind = NODE_STATE_KINDS.get(node["state"])
    handle = STATE_KIND_STEPS.get(kind) if kind is not None else None
    if handle is None:
        raise TraceStateError(
            f"node {node['id']!r} is in the trace state {node['state']!r}, which the pack "
            "exporter does not know"
        )
    return handle(node, job_status)


@dataclass
class StepRecords:
    """What the steps contribute to the pack: receipts' payloads, their times, the traces."""

    payloads: list[dict[str, Any]] = field(default_factory=list)
    timestamps: dict[str, str] = field(default_factory=dict)
    traces: dict[str, bytes] = field(default_factory=dict)  # step id -> JCS of its trace
    exponent_steps: list[str] = field(default_factory=list)


def step_records(
    episode: Episode,
    episode_id: str,
    job: JobRecord,
    job_input: Any,
    log: ReplayContext | AgentOutcome,
    times: tuple[str, str],
) -> StepRecords:
    """Each step's status and trace, in DAG order. ``times``: the job's creation and end."""
    all_deps = {s["step_id"]: list(s["depends_on"]) for s in episode.script_steps}
    order = F.kahn_order(list(all_deps), all_deps)
    assert order is not None  # a plan is a DAG
    status: dict[str, str] = {}
    out_hash: dict[str, str | None] = {}
    records = StepRecords()
    for sid in order:
        deps = all_deps[sid]
        blocked = any(status[d] != "PASS" for d in deps)
        opcode, st, trace_value, duration, ts = _step(
            episode, sid, blocked, job, job_input, log, times
        )
        status[sid] = st
        payload: dict[str, Any] = {
            "episode_id": episode_id,
            "step_id": sid,
            "opcode": opcode,
            "step_status": st,
            "comparator_tier": "A",
        }
        if st == "SKIPPED":
            out_hash[sid] = None
            payload.update(input_hashes=[], output_hash=None, output_size_bytes=0, duration_ms=0)
        else:
            trace_bytes = canonical(trace_value)
            if has_exponent_number(trace_bytes):
                records.exponent_steps.append(sid)
            records.traces[sid] = trace_bytes
            out_hash[sid] = F.prefixed(trace_bytes)
            payload.update(
                input_hashes=[out_hash[d] for d in deps],
                output_hash=out_hash[sid],
                output_size_bytes=len(trace_bytes),
                duration_ms=duration,
            )
        records.payloads.append(payload)
        records.timestamps[sid] = str(ts)
    return records


def _step(
    episode: Episode,
    sid: str,
    blocked: bool,
    job: JobRecord,
    job_input: Any,
    log: ReplayContext | AgentOutcome,
    times: tuple[str, str],
) -> tuple[str, str, Any, int, Any]:
    """(opcode, status, trace, duration, timestamp) of step ``sid``."""
    created_at, ended_at = times
    if sid == F.LOAD_STEP_ID:
        return "LOAD_INPUT", "PASS", job_input, 0, created_at
    if sid == F.EMIT_STEP_ID:
        if blocked:
            return "EMIT_OUTPUT", "SKIPPED", None, 0, ended_at
        if log.status == "completed":
            return (
                "EMIT_OUTPUT",
                "PASS",
                {"claim_type": "job_output", "output": log.output},
                0,
                ended_at,
            )
        failed = {"claim_type": "job_output", "status": log.status, "error": log.error}
        return "EMIT_OUTPUT", "FAIL", failed, 0, ended_at
    if blocked:
        return "APPLY_TRANSFORM", "SKIPPED", None, 0, ended_at
    n = episode.node_by_step[sid]
    st, trace_value, duration = node_step(n, str(job.status))
    ts = n.get("finished_at") or n.get("started_at") or ended_at
    return "APPLY_TRANSFORM", st, trace_value, duration, ts


def _ms(value: Any) -> int:
    try:
        return max(0, round(float(value or 0)))
    except (TypeError, ValueError):
        return 0
