"""One exception hierarchy for everything affidavit raises on purpose.

Every error carries a ``hint``: what the user should do next. The CLI and the HTTP API catch
:class:`AffidavitError` once and render ``message`` and ``hint``; anything else is a bug.

What kind of problem an error is travels with its class (and its stable ``code``); how that
shows in a face — the CLI's exit code, the HTTP status — is the faces' table
(:mod:`affidavit.faces.errors`), not the error's.
"""

from __future__ import annotations

from typing import Any


class AffidavitError(Exception):
    """Base of every error affidavit raises deliberately."""

    code: str = "error"
    default_hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def to_dict(self) -> dict[str, str]:
        """The error as the ``{"code", "message", "hint"}`` object of the CLI and API."""
        return {"code": self.code, "message": self.message, "hint": self.hint}


class ConfigError(AffidavitError):
    """A setting (URL, environment variable, option) is malformed or unsupported."""

    code = "config_error"
    default_hint = "Check the command-line options and AFFIDAVIT_* environment variables."


class ClockSkewError(ConfigError):
    """This host's clock is too far from the shared database server's for the lease: workers
    judge each other's leases by their own clocks."""

    code = "clock_skew"
    default_hint = (
        "Synchronize the clocks (NTP), or give every worker a longer lease (--lease-seconds, "
        "AFFIDAVIT_LEASE_SECONDS)."
    )


# --- canonical JSON -------------------------------------------------------------------------


class CanonicalizationError(AffidavitError):
    """A value cannot be represented in canonical JSON (RFC 8785)."""

    code = "not_canonicalizable"
    default_hint = (
        "Stored values must be JSON: string keys, integers within ±(2^53-1), finite numbers, "
        "no bytes. Convert the value before passing it in."
    )

    def __init__(self, message: str, *, path: str = "$", hint: str | None = None) -> None:
        super().__init__(f"{message} at {path}", hint=hint)
        self.path = path
        self.reason = message


# --- plans ----------------------------------------------------------------------------------


class PlanError(AffidavitError):
    """A plan is malformed. ``node_id`` names the offending node when there is one."""

    code = "invalid_plan"
    default_hint = "Fix the plan file; see the plan format in docs/plans.md."

    def __init__(self, message: str, *, node_id: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.node_id = node_id


class UnknownNodeTypeError(PlanError):
    code = "plan_unknown_node_type"
    default_hint = "A node's type must be one of: tool, pure, wait, approval."


class DuplicateNodeError(PlanError):
    code = "plan_duplicate_node"
    default_hint = "Every node id must be unique within the plan."


class DanglingDependencyError(PlanError):
    code = "plan_dangling_dependency"
    default_hint = "depends_on may only name nodes defined in the same plan."


class CycleError(PlanError):
    code = "plan_cycle"
    default_hint = "Remove one of the depends_on edges so that the graph has no cycle."


class BadReferenceError(PlanError):
    """A ``${...}`` reference names something that is not the input or an ancestor node."""

    code = "plan_bad_reference"
    default_hint = (
        "A ${...} reference may name `input` or a node this node depends on (directly or "
        "transitively); add the node to depends_on."
    )


# --- store ----------------------------------------------------------------------------------


class StoreError(AffidavitError):
    """The database failed or is unreachable."""

    code = "store_error"
    default_hint = "Check that the database is reachable and the URL is right (--db)."


class StoreUnavailable(StoreError):
    """The database could not be reached or stayed busy: a lost connection, a server that is
    restarting, a lock held past the busy timeout, a full disk. The same operation may succeed
    when it is tried again; a write that failed at its commit may or may not have landed."""

    code = "store_unavailable"
    default_hint = (
        "The database was unreachable or busy; try again once it is back (workers retry "
        "on their own)."
    )


class UnsupportedDatabaseURL(ConfigError):
    code = "unsupported_database_url"
    default_hint = (
        "Use sqlite:///path/to/file.db (relative) or sqlite:////abs/path.db, "
        "or postgresql://user@host:port/dbname."
    )


class MigrationError(StoreError):
    code = "migration_error"
    default_hint = "The database schema is newer or different than this version expects."


class NoSchemaError(MigrationError):
    """A database opened read-only holds no affidavit schema (nothing was ever written)."""


class ConflictError(StoreError):
    """An append's ``expected_version`` is not the job's current version."""

    code = "version_conflict"
    default_hint = "Another writer appended first: re-read the job's events and retry."

    def __init__(self, message: str, *, job_id: str, expected: int, actual: int) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.expected = expected
        self.actual = actual


class LedgerRowExists(StoreError):
    """A ledger insert sent as ``presumed_new`` found the key's row already there: the
    transaction wrote nothing. Run it again without the presumption (which reads the row)."""

    code = "ledger_row_exists"
    default_hint = "Internal: the step's first transaction is retried with the ledger row read."

    def __init__(self, message: str, *, job_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class IdempotencyConflict(AffidavitError):
    """A submission reuses an idempotency key with another plan or input than the job the key
    already names."""

    code = "idempotency_conflict"
    default_hint = (
        "The same key returns the same job only for the same plan and input: use a new key "
        "for a different job, or look the existing one up with `affidavit jobs show`."
    )


class CancelRequestedError(StoreError):
    """A write that would start something new in a job a person asked to cancel: a new tool
    invocation, a wait or the job's completion. The transaction wrote nothing; the run ends the
    job as cancelled instead (see :mod:`affidavit.runtime._cancel`)."""

    code = "cancel_requested"
    default_hint = "The job was asked to cancel: it ends cancelled at this step boundary."

    def __init__(self, message: str, *, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class FencedError(StoreError):
    """A write came from an attempt that no longer holds the job's lease."""

    code = "stale_attempt"
    default_hint = "This worker lost its lease on the job; another attempt owns it now."

    def __init__(self, message: str, *, job_id: str, fence: str, current: str | None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.fence = fence
        self.current = current


class NotFound(AffidavitError):
    """The thing named does not exist (or is not the caller's to see)."""

    code = "not_found"
    default_hint = "Check the id."


class JobNotFound(NotFound):
    code = "job_not_found"
    default_hint = "List jobs with `affidavit jobs list`."

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} not found")
        self.job_id = job_id


class WaitTimeout(AffidavitError):
    """A job waited for was still pending or running when the timeout passed."""

    code = "wait_timeout"
    default_hint = (
        "Is a worker running (`affidavit worker`)? A running job whose worker died is "
        "reclaimed when its lease expires."
    )

    def __init__(self, job: Any, timeout: float) -> None:
        super().__init__(f"job {job.job_id} is still {job.status} after {timeout:g} s")
        self.job = job  # the JobRecord as last read


class StreamError(AffidavitError):
    """A value ``ctx.emit`` refused (not JSON, too large, or over the job's stream limit):
    nothing was recorded."""

    code = "stream_refused"
    default_hint = (
        "Emit JSON values of at most 64 KiB; a job whose stream needs more values or bytes "
        "declares a larger limit: @affidavit.agent(..., stream=StreamLimit(...))."
    )


class InvalidEventError(AffidavitError):
    code = "invalid_event"
    default_hint = "Event payloads must match docs/formats.md §3."


class VerificationError(AffidavitError):
    """A check over stored or exported evidence failed."""

    code = "verification_failed"
    default_hint = "The record does not verify; treat it as tampered or incomplete."


class TamperedRecordError(VerificationError):
    """A stored record holds what affidavit never writes there (a value of another type, bytes
    that are not JSON): it was changed outside affidavit. ``where`` names the record."""

    code = "record_tampered"
    default_hint = (
        "The row was changed outside affidavit: treat the record as tampered (restore the "
        "database from a backup)."
    )

    def __init__(self, where: str, problem: str, *, hint: str | None = None) -> None:
        super().__init__(f"{where}: {problem}", hint=hint)
        self.where = where
        self.problem = problem


class ReplayError(AffidavitError):
    """A job's event log is structurally impossible: it cannot have been written by a runtime
    that follows the tool-step protocol (an event for a node the plan does not have, a finish
    without a start, an event after the job ended, ...). ``version`` names the first such event."""

    code = "replay_error"
    default_hint = "The log was edited or written by something else; run `affidavit verify JOB`."

    def __init__(
        self, message: str, *, version: int, job_id: str | None = None, hint: str | None = None
    ) -> None:
        where = f"event {version}" if job_id is None else f"job {job_id}, event {version}"
        super().__init__(f"{where}: {message}", hint=hint)
        self.version = version
        self.job_id = job_id


class UnreadableEventError(ReplayError):
    """A stored event row holds what no runtime writes there (a payload stored as text or
    that is not JSON, a field of another type): it was changed outside affidavit. Every
    reader of the log refuses the row this way; ``affidavit verify`` reports it as failed
    checks."""

    def __init__(self, job_id: str, version: int, problem: str) -> None:
        super().__init__(
            problem,
            version=version,
            job_id=job_id,
            hint=f"The row was changed outside affidavit: `affidavit verify {job_id}` checks "
            "the job's whole record.",
        )


class SignalRejected(AffidavitError):
    """A signal that matches no wait of the job, or arrives when the job cannot take it."""

    code = "signal_rejected"
    default_hint = "See the job's waits with `affidavit jobs show JOB`; nothing was written."


class SignalPayloadError(AffidavitError):
    """A signal payload the waiting node would not take as meant: an approval answered with a
    bare ``false`` or an ``approved`` that is not true or false, either of which approves."""

    code = "signal_payload_invalid"
    default_hint = (
        'Deny an approval with {"approved": false} (other fields may ride along); any other '
        "payload approves it. Nothing was written."
    )


class ForkRefused(AffidavitError):
    """A fork that cannot be made: its source job is not finished (has no seal), or the step it
    names is not one the source completed."""

    code = "fork_refused"
    default_hint = (
        "Fork a sealed job from a step it completed (a plan node id, an agent step's #SEQ or a "
        "step id; see `affidavit jobs show JOB`). Nothing was written."
    )


# --- claims and trust -----------------------------------------------------------------------


class AgentNotFound(NotFound):
    """A claimant or verifier agent is not registered."""

    code = "agent_not_found"
    default_hint = "Register the agent first: `affidavit agents add ID --namespace NS --role R`."

    def __init__(self, agent_id: str, *, what: str = "agent") -> None:
        super().__init__(f"{what} {agent_id!r} not found")
        self.agent_id = agent_id


class AgentExistsError(AffidavitError):
    code = "agent_exists"
    default_hint = "Agent ids are unique; choose another id or use the existing agent."


class ClaimRejected(AffidavitError):
    """A claim was refused before anything ran; nothing was executed or recorded."""

    code = "claim_rejected"
    default_hint = "Nothing was executed or recorded; fix the request and submit it again."


class SelfVerificationError(ClaimRejected):
    code = "self_verification"
    default_hint = "A claim must be verified by another agent than the one that made it."


class ValidationError(ClaimRejected):
    """A request of the claims layer (agent, pattern, query, claim) is malformed."""

    code = "invalid_input"
    default_hint = "See docs/claims.md for agents, claim types and the rules a claim may contain."


class InvalidClaim(ValidationError):
    """An unknown claim type or a malformed claim."""

    code = "invalid_claim"
    default_hint = "See docs/claims.md for the claim types and the rules a claim may contain."


class CommandNotAllowed(ValidationError):
    """The verification command is not on the allow-list or uses a refused form."""

    code = "command_not_allowed"
    default_hint = (
        "Use a bare program name from the allow-list (no path, no shell, no inline code); "
        "see docs/claims.md."
    )


class AuthorizationError(ClaimRejected):
    """The verifier may not verify this claim."""

    code = "forbidden"
    default_hint = "Verify with an agent of role agent or admin in the claimant's namespace."


class VerifierRoleForbidden(AuthorizationError):
    code = "verifier_role_forbidden"
    default_hint = "Only agents with role `agent` or `admin` may verify claims."


class NamespaceForbidden(AuthorizationError):
    code = "verifier_namespace_forbidden"
    default_hint = (
        "Only a verifier in the claimant's namespace, or an admin, may verify its claims."
    )
