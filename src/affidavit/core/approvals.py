"""Who may decide an approval, and what a decision says (docs/formats.md §7).

An approval is decided only by a principal other than the job's submitter whose role is
``approver`` or ``admin``; an approval's policy may narrow that further to some roles or some
principals (``approvers``) and ask for several distinct approvals (``min_approvals``). A
decision is exactly ``{"approved": true|false}``, optionally with a ``comment``.

Shared by the runtime (which records decisions) and the verifier (which checks them offline),
so both read one rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.core.errors import AffidavitError, PlanError, SignalPayloadError

# The roles that may decide an approval (the API's roles: see affidavit.faces.auth).
APPROVING_ROLES = ("approver", "admin")
MAX_APPROVERS = 32  # entries of an approval's ``approvers``
MAX_MIN_APPROVALS = 16
MAX_PRINCIPAL = 128  # characters of a principal's name
MAX_COMMENT = 2000  # characters of a decision's comment
DEFAULT_APPROVERS: tuple[str, ...] = APPROVING_ROLES
# the prefix of the principal the local CLI (direct database access) decides as
OPERATOR_PREFIX = "operator:"
# the error of an approval answered with {"approved": false}
NOT_APPROVED = {"type": "not_approved", "message": "approval was denied"}


class ApprovalRefused(AffidavitError):
    """A principal that may not decide this approval tried to."""

    code = "approval_forbidden"
    default_hint = (
        "An approval is decided by a principal other than the job's submitter, with role "
        "approver or admin (and among the approval's `approvers`, if it names any). Nothing "
        "was written."
    )


class SignalForbidden(AffidavitError):
    """A caller whose role may decide approvals but not signal other waits signalled one."""

    code = "forbidden"
    default_hint = "Signal a wait with a key of role agent or above. Nothing was written."


@dataclass(frozen=True, slots=True)
class Principal:
    """Who decides: ``name`` (an API key's agent id, or ``operator:NAME`` for the local CLI),
    its ``role`` and the ``key_id`` it authenticated with (``None`` for the CLI)."""

    name: str
    role: str
    key_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"principal": self.name, "role": self.role, "key_id": self.key_id}


def operator(name: str) -> Principal:
    """The principal of the local CLI run as ``name`` (``--as NAME``): ``operator:NAME``, role
    admin (it holds the database).

    Raises:
        ApprovalRefused: an empty or overlong name.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_PRINCIPAL - 9:
        raise ApprovalRefused(
            f"invalid operator name {name!r}",
            hint="Name yourself with --as NAME (1–119 characters): recorded as operator:NAME.",
        )
    return Principal(OPERATOR_PREFIX + name.strip(), "admin")


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """Who may decide one approval: ``approvers`` (role names and principal names; any one
    of them suffices) and how many distinct approvals grant it."""

    approvers: tuple[str, ...] = DEFAULT_APPROVERS
    min_approvals: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"approvers": list(self.approvers), "min_approvals": self.min_approvals}

    @classmethod
    def parse(cls, approvers: Any, min_approvals: Any, where: str) -> ApprovalPolicy:
        """The policy of ``approvers`` / ``min_approvals`` as given (``None``: the default).

        Raises:
            PlanError: a malformed value (named with ``where``).
        """
        if approvers is None:
            listed: tuple[str, ...] = DEFAULT_APPROVERS
        elif (
            not isinstance(approvers, list | tuple)
            or not 1 <= len(approvers) <= MAX_APPROVERS
            or not all(
                isinstance(a, str) and 0 < len(a) <= MAX_PRINCIPAL and a.strip() == a
                for a in approvers
            )
        ):
            raise PlanError(
                f"{where}: `approvers` must be a list of 1 to {MAX_APPROVERS} role names or "
                f"principal names, not {str(approvers)[:60]}",
                hint="For example approvers: [approver] or [alice, bob].",
            )
        elif any(a in ("observer", "agent") for a in approvers):
            raise PlanError(
                f"{where}: `approvers` names a role that may not decide approvals (observer or "
                "agent)",
                hint="List approver, admin, or the principals (agent ids) who may decide it.",
            )
        else:
            listed = tuple(dict.fromkeys(approvers))
        if min_approvals is None:
            count = 1
        elif type(min_approvals) is not int or not 1 <= min_approvals <= MAX_MIN_APPROVALS:
            raise PlanError(
                f"{where}: `min_approvals` must be an integer from 1 to {MAX_MIN_APPROVALS}, "
                f"not {min_approvals!r}"
            )
        else:
            count = min_approvals
        names = [a for a in listed if a not in APPROVING_ROLES]
        if names and not any(a in APPROVING_ROLES for a in listed) and len(names) < count:
            raise PlanError(
                f"{where}: `min_approvals` is {count} but only {len(names)} principal(s) may "
                "approve: the approval could never be granted"
            )
        return cls(listed, count)

    @classmethod
    def recorded(cls, wait: Mapping[str, Any]) -> ApprovalPolicy:
        """The policy a ``job_waiting`` event recorded (the default when it names none)."""
        return cls.parse(wait.get("approvers"), wait.get("min_approvals"), "the wait")

    def why_not(self, who: Principal, submitter: str | None) -> str | None:
        """Why ``who`` may not decide this approval of a job ``submitter`` submitted; ``None``
        when it may."""
        if submitter is not None and who.name == submitter:
            return f"{who.name!r} submitted the job: the submitter may not decide its approvals"
        if who.role not in APPROVING_ROLES:
            return f"role {who.role!r} may not decide approvals; it needs approver or admin"
        if who.role not in self.approvers and who.name not in self.approvers:
            return (
                f"{who.name!r} is not among this approval's approvers ({', '.join(self.approvers)})"
            )
        return None


def decision_of(payload: Any, key: str) -> tuple[bool, str | None]:
    """The decision an approval's signal payload states: ``(approved, comment)``.

    Raises:
        SignalPayloadError: anything but ``{"approved": true|false}`` with an optional text
            ``comment`` (an empty payload decides nothing).
    """
    hint = (
        'Decide an approval with {"approved": true} or {"approved": false}, optionally with '
        '"comment": "...". Nothing was written.'
    )
    if not isinstance(payload, dict) or type(payload.get("approved")) is not bool:
        shown = "nothing" if payload is None else str(payload)[:60]
        raise SignalPayloadError(
            f'the approval {key!r} takes {{"approved": true|false}}, not {shown}', hint=hint
        )
    extra = sorted(set(payload) - {"approved", "comment"})
    if extra:
        raise SignalPayloadError(
            f"the approval {key!r} takes only approved and comment, not {', '.join(extra)[:60]}",
            hint=hint,
        )
    comment = payload.get("comment")
    if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
        raise SignalPayloadError(
            f"the comment of approval {key!r} must be text of at most {MAX_COMMENT} characters",
            hint=hint,
        )
    return payload["approved"], comment


def granted(votes: Sequence[Mapping[str, Any]], policy: ApprovalPolicy) -> bool | None:
    """What ``votes`` (each with ``principal`` and ``approved``) decide under ``policy``:
    ``False`` once any is a rejection, ``True`` once ``min_approvals`` distinct principals
    approved, ``None`` while undecided."""
    if any(v.get("approved") is False for v in votes):
        return False
    approving = {v.get("principal") for v in votes if v.get("approved") is True}
    return True if len(approving) >= policy.min_approvals else None


def call_approval_key(job_id: str, step_id: str, args_hash: str) -> str:
    """The correlation key of the approval of one tool call (its step and argument hash)."""
    return f"{job_id}:approve:{step_id}:{args_hash}"
