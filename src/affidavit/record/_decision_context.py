"""What a person is asked to decide about a job, read from its log: the park in force (the
tool, its resolved arguments, the external idempotency key, what ``reconcile`` found, the
mismatches confirmation replay saw) and the open waits (for an approval, the payload the plan
attached to it).

The service function behind ``GET /api/jobs/{id}/decisions`` and the decision panel of the
trace page. Read-only: one consistent snapshot of the job, its log and its ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from affidavit.core.approvals import ApprovalPolicy
from affidavit.core.errors import JobNotFound, ReplayError
from affidavit.core.parks import DECISIONS_BY_REASON
from affidavit.core.plan import external_key
from affidavit.record._args import ArgsResolutionError, resolve
from affidavit.record._opened import SubjectView
from affidavit.record._replay import ReplayContext, ReplayContextBuilder
from affidavit.store import LedgerRow, Store


def decision_context(store: Store, job_id: str) -> dict[str, Any]:
    """The decisions ``job_id`` waits for, each with what it is about.

    ``park`` (``None`` unless the job is parked): the park's ``version`` (what a resume pins),
    ``reason``, ``since``, the ``decisions`` its reason allows, the ``node_id`` and ``tool``,
    the tool's resolved ``args`` (or ``args_error``), the ``idempotency_key`` and the
    ``external_key`` the tool was given; for an in-flight park, ``reconcile`` (whether the
    tool has a hook, and the hook's error); for a confirmation park, the ``mismatches``
    (resource, ``recorded`` and ``observed`` versions, reason, verifier) and the step's
    ``recorded_result``.

    ``waits`` (empty unless the job is waiting): each open wait's ``node_id``, ``wait_type``
    (``approval`` or ``signal``), ``correlation_key`` (what a signal names), ``since``, and
    ``payload`` — the node's ``args`` resolved, what the plan attached for the person to see
    (``None`` when it attached nothing); for an agent job, the payload its ``ctx.approval``
    call recorded (a park's ``args``: the call's recorded args). An approval's also has who
    may decide it (``approvers``, ``min_approvals``), the ``approvals`` recorded so far, and,
    for the approval of a tool's call, the ``call`` (step id, tool, argument hash, arguments;
    its ``payload``: the arguments).

    Raises:
        JobNotFound: no such job.
        ReplayError: the log is structurally impossible (see ``affidavit verify``).
    """
    view = SubjectView(store, job_id)  # a subject's values: opened, or shown erased
    with store.snapshot() as snap:
        job = snap.get_job(job_id)
        if job is None:
            raise JobNotFound(job_id)
        builder = ReplayContextBuilder()
        for event in snap.iter_events(job_id):
            try:
                payload = view.payload(event)
            except (ValueError, RecursionError):
                raise ReplayError("the stored payload is not JSON", version=event.version) from None
            builder.add(event, payload)
        ledger = {row.idempotency_key: row for row in snap.ledger_list(job_id)}
    replay = builder.ctx
    nodes = {n["id"]: n for n in (replay.task_graph or {"nodes": []})["nodes"]}
    nodes.update(_agent_nodes(replay))
    park = _park(job_id, replay, nodes, ledger) if job.status == "parked" else None
    waits = (
        [
            _wait(replay, nodes, key, wait)
            for key, wait in replay.waits.items()
            if key not in replay.completed_waits
        ]
        if job.status == "waiting"
        else []
    )
    return {
        "job_id": job_id,
        "status": job.status,
        "version": job.version,
        "park": park,
        "waits": waits,
    }


def _agent_nodes(replay: ReplayContext) -> dict[str, dict[str, Any]]:
    """An agent job's recorded calls as the nodes a decision names. Their args are the values
    recorded as called (an approval's: its payload), never references to resolve."""
    out: dict[str, dict[str, Any]] = {}
    for called in replay.agent_steps.values():
        kind, node_id = called.get("kind"), str(called.get("node_id"))
        recorded = called.get("args")
        args: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        if kind in ("wait", "approval"):
            out[node_id] = {"id": node_id, "type": kind, "recorded_args": args.get("payload")}
        elif kind in ("tool", "pure"):
            tool = called.get("tool_name")
            out[node_id] = {"id": node_id, "type": kind, "tool": tool, "recorded_args": args}
    return out


def _resolved(replay: ReplayContext, node: Mapping[str, Any] | None) -> tuple[Any, str | None]:
    """The node's args resolved against the job input and the outputs recorded so far, or
    why they cannot be (an upstream output it names is not recorded)."""
    if node is None:
        return None, "the step is not a node of the job's plan"
    if "recorded_args" in node:  # an agent job's call
        return node["recorded_args"], None
    args = node.get("args")
    if not args:
        return ({} if node.get("type") in ("tool", "pure") else None), None
    scope: dict[str, Any] = {"input": replay.input}
    scope.update({n: replay.node_output(n) for n in replay.completed_nodes})
    try:
        return resolve(args, scope, str(node["id"])), None
    except ArgsResolutionError as exc:
        return None, exc.message


def _park(
    job_id: str,
    replay: ReplayContext,
    nodes: Mapping[str, Mapping[str, Any]],
    ledger: Mapping[str, LedgerRow],
) -> dict[str, Any] | None:
    parked = replay.parked
    if parked is None or replay.parked_version is None:
        return None
    reason = str(parked.get("reason"))
    node_id = parked.get("node_id")
    detail = parked.get("detail") or {}
    node = nodes.get(str(node_id))
    args, args_error = _resolved(replay, node)
    key = parked.get("idempotency_key")
    if key is None and reason == "replay_verification":
        # the committed invocation whose recorded change the world no longer matches
        key = next(
            (
                k
                for k, inv in replay.invocations.items()
                if inv.node_id == node_id and inv.committed
            ),
            None,
        )
    row = ledger.get(str(key)) if key is not None else None
    tool = detail.get("tool_name") or (row.tool_name if row else None) or (node or {}).get("tool")
    attempt_id = detail.get("dead_attempt_id") if reason == "in_flight" else None
    if attempt_id is None and row is not None:
        attempt_id = row.attempt_id
    step_id = parked.get("step_id") or replay.step_ids.get(str(node_id))
    out: dict[str, Any] = {
        "version": replay.parked_version,
        "reason": reason,
        "since": parked.get("at"),
        "decisions": list(DECISIONS_BY_REASON.get(reason, ("fail",))),
        "node_id": node_id,
        "step_id": step_id,
        "tool": tool,
        "args": args,
        "idempotency_key": key,
        "external_key": external_key(job_id, str(step_id), attempt_id)
        if key is not None and step_id is not None
        else None,
        "message": detail.get("message"),
    }
    if args_error is not None:
        out["args_error"] = args_error
    if reason == "in_flight":
        error = detail.get("reconcile_error")
        out["reconcile"] = {"hook": error is not None, "error": error}
    if reason == "replay_verification":
        out["mismatches"] = [_mismatch(m) for m in detail.get("mismatches", [])]
        if key is not None and key in replay.invocations:
            out["recorded_result"] = replay.invocations[str(key)].result
    if reason == "crash_loop":
        out["detail"] = detail
    return out


def _mismatch(m: Mapping[str, Any]) -> dict[str, Any]:
    resource = m.get("resource") or {}
    recorded = resource.get("etag") if resource.get("etag") is not None else resource.get("version")
    return {
        "node_id": m.get("node_id"),
        "resource_type": resource.get("resource_type"),
        "resource_id": resource.get("resource_id"),
        "operation": resource.get("operation"),
        "recorded": recorded,
        "observed": m.get("observed"),
        "reason": m.get("reason"),
        "verifier": m.get("verifier"),
    }


def _wait(
    replay: ReplayContext,
    nodes: Mapping[str, Mapping[str, Any]],
    key: str,
    wait: Mapping[str, Any],
) -> dict[str, Any]:
    node_id = str(wait["node_id"])
    node = nodes.get(node_id)
    payload, payload_error = _resolved(replay, node)
    out: dict[str, Any] = {
        "node_id": node_id,
        "wait_type": wait.get("wait_type")
        or ("approval" if (node or {}).get("type") == "approval" else "signal"),
        "correlation_key": key,
        "since": wait.get("at"),
        "payload": payload,
    }
    if payload_error is not None and node is not None:
        out["payload_error"] = payload_error
    if out["wait_type"] == "approval":  # who may decide it, what was decided so far
        out.update(ApprovalPolicy.recorded(wait).to_dict())
        out["approvals"] = [
            {k: v.get(k) for k in ("at", "principal", "role", "key_id", "approved", "comment")}
            for v in replay.approval_votes.get(key, ())
        ]
        if "call" in wait:  # a tool's call, asked for by the runtime: what it would run
            out["call"] = wait["call"]
            out["payload"] = wait["call"].get("args")
            out.pop("payload_error", None)
    return out
