"""The approvals of one log, checked offline (invariant ``approval``).

What a log verified ✓ proves about its approvals:

- every approval was decided by principals its recorded policy (``approvers``,
  ``min_approvals`` of its ``job_waiting``) allows: of role approver or admin, none the job's
  submitter (``job_created``'s ``submitted_by``), each decision recorded (``approval_recorded``
  for those before the last, ``decided_by`` of its ``wait_completed`` for all), and the
  decision the log acts on is the one those decisions make (a rejection, or
  ``min_approvals`` distinct approvals);
- every tool call the log marks as requiring approval (``requires_approval`` on its
  ``tool_invocation_started``) was preceded by a granted approval of exactly that call: its
  step id, tool and argument hash;
- a call the log shows an approval request for was not invoked without the mark.

An approval whose ``job_waiting`` records no policy (no ``min_approvals``: written before
policies were recorded) is checked only for being open when decided; its ``wait_completed``
names who signalled it, nothing more.

What it cannot prove: a log that never states a requirement (no mark, no request) reads as a
tool that required none — only the tool's code, or a verifier told which tools require
approval, knows otherwise. And the principals named are those the runtime authenticated (API
keys, the CLI's ``--as``): they do not sign their decisions, so whoever holds the sealing key
can write a log naming any of them.

Each method raises ``_Violation`` (invariant ``approval``) for what is wrong with the event;
the fold reports it with the event's version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from affidavit.core.approvals import ApprovalPolicy, Principal, call_approval_key, granted
from affidavit.core.errors import AffidavitError
from affidavit.verify._violation import _Violation

INVARIANT = "approval"
_DECISION_FIELDS = ("at", "principal", "role", "key_id", "approved", "comment")


class ApprovalFold:
    """The approval state of one log as it is folded."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.submitter: str | None = None
        self.policies: dict[str, ApprovalPolicy] = {}  # open or decided approvals, by key
        self.calls: dict[str, Mapping[str, Any]] = {}  # a call approval's key -> its call
        self.votes: dict[str, list[Mapping[str, Any]]] = {}
        self.granted: set[str] = set()
        self.recorded: set[str] = set()  # approvals whose job_waiting records their policy
        self.decided: set[str] = set()
        self.marked: set[tuple[str, str]] = set()  # (step id, args hash) invoked with the mark

    def created(self, p: Mapping[str, Any]) -> None:
        by = p.get("submitted_by")
        self.submitter = by if isinstance(by, str) else None

    def waiting(self, p: Mapping[str, Any], node_step: str | None) -> None:
        """A ``job_waiting``; ``node_step``: the step id of the node it names."""
        _check(self._waiting(p, node_step))

    def vote(self, p: Mapping[str, Any]) -> None:
        """An ``approval_recorded``."""
        _check(self._vote(p))

    def completed(self, p: Mapping[str, Any]) -> None:
        """A ``wait_completed``."""
        _check(self._completed(p))

    def invocation(self, p: Mapping[str, Any]) -> None:
        """A ``tool_invocation_started`` marked ``requires_approval``."""
        _check(self._invocation(p))

    def _waiting(self, p: Mapping[str, Any], node_step: str | None) -> str | None:
        if p.get("wait_type") != "approval":
            return None if "call" not in p else "only an approval wait names a call"
        key = str(p.get("correlation_key"))
        if "min_approvals" in p:
            self.recorded.add(key)
        try:
            self.policies[key] = ApprovalPolicy.recorded(p)
        except AffidavitError as exc:
            return f"the approval {key!r} records an unreadable policy: {exc.message}"
        call = p.get("call")
        if call is None:
            return None
        if not isinstance(call, dict) or call.get("step_id") != node_step:
            return f"the approval {key!r} names a call of another step than its node's"
        expected = call_approval_key(self.job_id, str(node_step), str(call.get("args_hash")))
        if key != expected:
            return f"the approval {key!r} of a call is not keyed by that call ({expected!r})"
        self.calls[key] = call
        return None

    def _vote(self, p: Mapping[str, Any]) -> str | None:
        key = str(p.get("correlation_key"))
        policy = self.policies.get(key)
        if policy is None or key in self.decided:
            return f"a decision on {key!r}, which is no open approval"
        problem = self._allowed(policy, p, key)
        if problem is None:
            self.votes.setdefault(key, []).append(p)
        return problem

    def _completed(self, p: Mapping[str, Any]) -> str | None:
        key = str(p.get("correlation_key"))
        policy = self.policies.get(key)
        if policy is None:
            return None  # not an approval
        self.decided.add(key)
        if key not in self.calls and key not in self.recorded:
            return None  # an approval recorded without its policy (see the module docstring)
        decided_by = p.get("decided_by")
        if not isinstance(decided_by, list) or not decided_by:
            return f"the approval {key!r} was answered without the decisions that made it"
        for entry in decided_by:
            problem = self._allowed(policy, entry, key) if isinstance(entry, dict) else "?"
            if problem is not None:
                return problem if problem != "?" else f"a decision on {key!r} is not an object"
        earlier = [_decision(v) for v in self.votes.get(key, ())]
        if [_decision(e) for e in decided_by[:-1]] != earlier:
            return f"the decisions on {key!r} are not the ones recorded before its answer"
        if p.get("signalled_by") != decided_by[-1].get("principal"):
            return f"the approval {key!r} names another principal than its last decision's"
        outcome = granted(decided_by, policy)
        answer = p.get("payload")
        stated = answer.get("approved") if isinstance(answer, dict) else None
        if outcome is None or stated is not outcome:
            return (
                f"the approval {key!r} is answered {stated!r}, but its decisions make it "
                f"{'undecided' if outcome is None else outcome}"
            )
        if outcome:
            self.granted.add(key)
        return None

    def _invocation(self, p: Mapping[str, Any]) -> str | None:
        step, hashed, tool = p.get("step_id"), p.get("args_hash"), p.get("tool_name")
        key = p.get("approval_key")
        call = self.calls.get(key) if isinstance(key, str) else None
        if (
            p.get("requires_approval") is not True
            or call is None
            or key not in self.granted
            or (call.get("step_id"), call.get("args_hash"), call.get("tool_name"))
            != (step, hashed, tool)
        ):
            return (
                f"tool {tool!r} at step {step!r} requires approval of its call, and no granted "
                "approval of that call (its step and argument hash) precedes it"
            )
        self.marked.add((str(step), str(hashed)))
        return None

    def unmarked(self, started: Iterable[tuple[Any, ...]]) -> str | None:
        """At the end: a call with an approval request that was invoked without the mark
        (``started``: each invocation's ``(invocation, node, tool, args hash, step)``)."""
        requested = {(str(c.get("step_id")), str(c.get("args_hash"))) for c in self.calls.values()}
        for _, _, tool, hashed, step in started:
            call = (str(step), str(hashed))
            if call in requested and call not in self.marked:
                return (
                    f"tool {tool!r} at step {step!r} was invoked without the approval its call "
                    "was asked for"
                )
        return None

    def _allowed(self, policy: ApprovalPolicy, entry: Mapping[str, Any], key: str) -> str | None:
        name, role, key_id = entry.get("principal"), entry.get("role"), entry.get("key_id")
        if (
            not isinstance(name, str)
            or not isinstance(role, str)
            or type(entry.get("approved")) is not bool
        ):
            return f"a decision on {key!r} names no principal, role or decision"
        why = policy.why_not(
            Principal(name, role, key_id if isinstance(key_id, str) else None), self.submitter
        )
        return (
            None
            if why is None
            else f"the approval {key!r} was decided by a principal it does not allow: {why}"
        )


def _check(problem: str | None) -> None:
    if problem is not None:
        raise _Violation(INVARIANT, problem)


def _decision(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: entry.get(k) for k in _DECISION_FIELDS}
