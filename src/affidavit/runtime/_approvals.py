"""Approvals: recording a principal's decision, and the gate before a tool that requires one.

A decision (:func:`record_decision`, behind ``signal_job`` for an approval wait) is accepted
only from a principal the approval's policy allows (:mod:`affidavit.core.approvals`); each
decision that does not yet decide the approval is recorded as ``approval_recorded``, and the
one that decides it (a rejection, or the ``min_approvals``-th distinct approval) as the wait's
``wait_completed``, which lists every decision that counted (``decided_by``).

The gate (:func:`gate_call`) runs before a tool that requires approval acts: unless the log
holds an approval of exactly that call (its step id and argument hash), the job waits for one
— whatever the plan or the agent's code asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from affidavit.core.approvals import (
    NOT_APPROVED,
    ApprovalPolicy,
    ApprovalRefused,
    Principal,
    call_approval_key,
    decision_of,
    granted,
)
from affidavit.core.events import utc_now
from affidavit.record import ReplayContext
from affidavit.runtime._journal import Journal
from affidavit.runtime._run_base import Item, StepFailed, Stop
from affidavit.runtime._sdk import Tool
from affidavit.store import JobRecord, NewEvent, Transaction


def record_decision(
    tx: Transaction,
    job: JobRecord,
    replay: ReplayContext,
    wait: Mapping[str, Any],
    key: str,
    payload: Any,
    principal: Principal | None,
) -> tuple[JobRecord, bool]:
    """Record ``principal``'s decision ``payload`` on the open approval ``key`` of ``job``
    (locked in ``tx``). Returns ``(job, appended)``: an approval by a principal that approved
    already appends nothing (it counts once).

    Raises:
        SignalPayloadError: ``payload`` is not ``{"approved": true|false}`` (+ ``comment``).
        ApprovalRefused: no principal, or one the approval's policy does not allow.
    """
    if principal is None:
        raise ApprovalRefused(
            f"the approval {key!r} of job {job.job_id} needs a named principal to decide it",
            hint="From the CLI, name yourself with --as NAME (recorded as operator:NAME); "
            "over the API, use a key of role approver.",
        )
    # the submitter as the log records it (what verify checks), and as the job row says
    why = ApprovalPolicy.recorded(wait).why_not(principal, replay.submitted_by)
    if why is None and job.submitted_by != replay.submitted_by:
        why = ApprovalPolicy().why_not(principal, job.submitted_by)
    if why is not None:
        raise ApprovalRefused(f"{why}: nothing was recorded for approval {key!r}")
    approved, comment = decision_of(payload, key)
    votes = list(replay.approval_votes.get(key, ()))
    if approved and any(v.get("principal") == principal.name and v.get("approved") for v in votes):
        return job, False
    vote: dict[str, Any] = {"at": utc_now(), **principal.to_dict(), "approved": approved}
    if comment is not None:
        vote["comment"] = comment
    decided = granted([*votes, vote], ApprovalPolicy.recorded(wait))
    where = {"node_id": wait["node_id"], "correlation_key": key}
    if decided is None:
        tx.append(
            job.job_id,
            [NewEvent("approval_recorded", {**vote, **where})],
            expected_version=job.version,
        )
        return tx.update_job(job.job_id, status="waiting"), True
    answer: dict[str, Any] = {"approved": decided}
    if comment is not None:
        answer["comment"] = comment
    completed = {
        "at": vote["at"],
        **where,
        "payload": answer,
        "signalled_by": principal.name,
        "decided_by": [_counted(v) for v in (*votes, vote)],
    }
    tx.append(job.job_id, [NewEvent("wait_completed", completed)], expected_version=job.version)
    return tx.update_job(job.job_id, status="pending"), True


def _counted(vote: Mapping[str, Any]) -> dict[str, Any]:
    """A decision as ``wait_completed`` lists it."""
    return {
        k: vote[k]
        for k in ("at", "principal", "role", "key_id", "approved", "comment")
        if k in vote
    }


def gate_call(
    journal: Journal,
    replay: ReplayContext,
    tool: Tool,
    node_id: str,
    step_id: str,
    args_jcs: bytes,
    args_hash: str,
    prelude: tuple[Item, ...],
) -> str | None:
    """Before ``tool`` acts at step ``step_id`` with the arguments ``args_jcs`` (their
    canonical bytes, as recorded): ``None`` when it requires no approval for them; the
    approval's correlation key when the log holds an approval of this call. Otherwise the job
    waits for one (recorded with ``prelude``; an open request is not asked again).

    Raises:
        Stop: ``"waiting"``: the call is not approved yet.
        StepFailed: the call's approval was rejected (the job fails; the tool never ran).
    """
    if not tool.requires_approval:
        return None
    args = orjson.loads(args_jcs)  # (the values as recorded: what a person approves)
    if not tool.needs_approval(args):
        return None
    key = call_approval_key(journal.job_id, step_id, args_hash)
    done = replay.completed_waits.get(key)
    if done is not None:
        answer = done.get("payload")
        if isinstance(answer, dict) and answer.get("approved") is True:
            return key
        raise StepFailed(node_id, dict(NOT_APPROVED))
    if key in replay.waits:
        raise Stop("waiting")
    policy = tool.approval_policy
    waiting = {
        "node_id": node_id,
        "wait_type": "approval",
        "correlation_key": key,
        "reason": f"tool {tool.name!r} requires approval of this call",
        **policy.to_dict(),
        "call": {"step_id": step_id, "tool_name": tool.name, "args_hash": args_hash, "args": args},
    }
    # an agent's step_called holds its args as canonical bytes (for the fast path): the wait
    # is written in full, so they are given as the object they encode
    plain = tuple((t, {**p, "args": args}) if t == "step_called" else (t, p) for t, p in prelude)
    raise journal.wait(*plain, ("job_waiting", waiting))
