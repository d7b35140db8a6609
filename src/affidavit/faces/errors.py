"""How each error shows in a face: the CLI's exit code and the HTTP status of the API and of
``affidavit mcp`` over HTTP — one table for the three faces, keyed by the error's class
(``module.QualifiedName``: a face does not import the layers it does not use to learn what their
errors mean). The errors themselves (:mod:`affidavit.core.errors` and the layers' own) say only
what went wrong and what to do next.

An error class missing from the table takes the mapping of its nearest base that is in it (a
subclass a user defines, for one); every class affidavit defines has its own row (a test holds
the table to that).

Exit codes (documented per command): 0 success; 1 a check failed or a decision was refused;
2 not found; 3 usage or store error; 5 a claim refused before anything ran.
"""

from __future__ import annotations

from affidavit.core.errors import AffidavitError

EXIT_FAILED = FAILED = 1
EXIT_NOT_FOUND = NOT_FOUND = 2
EXIT_USAGE_OR_STORE = USAGE_OR_STORE = 3
EXIT_REFUSED = REFUSED = 5

# error class → (CLI exit code, HTTP status)
FACES: dict[str, tuple[int, int]] = {
    "affidavit.core.errors.AffidavitError": (USAGE_OR_STORE, 400),
    "affidavit.core.errors.ConfigError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.ClockSkewError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.UnsupportedDatabaseURL": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.CanonicalizationError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.PlanError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.UnknownNodeTypeError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.DuplicateNodeError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.DanglingDependencyError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.CycleError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.BadReferenceError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.StoreError": (USAGE_OR_STORE, 503),
    "affidavit.core.errors.StoreUnavailable": (USAGE_OR_STORE, 503),
    "affidavit.core.errors.MigrationError": (USAGE_OR_STORE, 503),
    "affidavit.core.errors.NoSchemaError": (USAGE_OR_STORE, 503),
    "affidavit.core.errors.ConflictError": (USAGE_OR_STORE, 409),
    "affidavit.core.errors.LedgerRowExists": (USAGE_OR_STORE, 503),
    "affidavit.core.errors.CancelRequestedError": (USAGE_OR_STORE, 409),
    "affidavit.core.errors.FencedError": (USAGE_OR_STORE, 503),
    "affidavit.core.errors.IdempotencyConflict": (USAGE_OR_STORE, 409),
    "affidavit.core.errors.NotFound": (NOT_FOUND, 404),
    "affidavit.core.errors.JobNotFound": (NOT_FOUND, 404),
    "affidavit.core.errors.AgentNotFound": (NOT_FOUND, 404),
    "affidavit.core.errors.WaitTimeout": (USAGE_OR_STORE, 400),
    "affidavit.core.errors.StreamError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.InvalidEventError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.VerificationError": (FAILED, 400),
    "affidavit.core.errors.TamperedRecordError": (FAILED, 409),
    "affidavit.core.errors.ReplayError": (USAGE_OR_STORE, 409),
    "affidavit.core.errors.UnreadableEventError": (USAGE_OR_STORE, 409),
    "affidavit.core.errors.SignalRejected": (FAILED, 409),
    "affidavit.core.errors.SignalPayloadError": (USAGE_OR_STORE, 422),
    "affidavit.core.errors.ForkRefused": (USAGE_OR_STORE, 409),
    "affidavit.core.errors.AgentExistsError": (USAGE_OR_STORE, 409),
    "affidavit.core.errors.ClaimRejected": (REFUSED, 400),
    "affidavit.core.errors.SelfVerificationError": (REFUSED, 403),
    "affidavit.core.errors.ValidationError": (REFUSED, 422),
    "affidavit.core.errors.InvalidClaim": (REFUSED, 422),
    "affidavit.core.errors.CommandNotAllowed": (REFUSED, 422),
    "affidavit.core.errors.AuthorizationError": (REFUSED, 403),
    "affidavit.core.errors.VerifierRoleForbidden": (REFUSED, 403),
    "affidavit.core.errors.NamespaceForbidden": (REFUSED, 403),
    "affidavit.faces.auth.ApiKeyNotFound": (NOT_FOUND, 404),
    "affidavit.faces.auth.Unauthorized": (USAGE_OR_STORE, 401),
    "affidavit.faces.auth.Forbidden": (USAGE_OR_STORE, 403),
    "affidavit.faces.limits.PayloadTooLarge": (USAGE_OR_STORE, 413),
    "affidavit.faces.limits.ClaimsBusy": (USAGE_OR_STORE, 503),
    "affidavit.faces.limits.StreamsBusy": (USAGE_OR_STORE, 503),
    "affidavit.faces.ratelimit.RateLimited": (USAGE_OR_STORE, 429),
    "affidavit.client.errors.ApiError": (USAGE_OR_STORE, 502),
    "affidavit.client.errors.ServerUnreachable": (USAGE_OR_STORE, 503),
    "affidavit.claims.bwrap.SandboxUnavailable": (REFUSED, 503),
    "affidavit.claims.kinds.CommandUnfitForClaim": (REFUSED, 422),
    "affidavit.claims.made.ClaimNotFound": (NOT_FOUND, 404),
    "affidavit.core.approvals.ApprovalRefused": (FAILED, 403),
    "affidavit.core.approvals.SignalForbidden": (FAILED, 403),
    "affidavit.core.inputs.InputTooLarge": (USAGE_OR_STORE, 422),
    "affidavit.core.merkle.ProofError": (FAILED, 400),
    "affidavit.core.note.NoteError": (FAILED, 400),
    "affidavit.core.signing.SigningKeyError": (USAGE_OR_STORE, 422),
    "affidavit.core.tags.InvalidTags": (USAGE_OR_STORE, 422),
    "affidavit.core.signing.SealKeyRefused": (USAGE_OR_STORE, 422),
    "affidavit.core.privacy.SubjectError": (USAGE_OR_STORE, 422),
    "affidavit.core.privacy.SubjectNotFound": (NOT_FOUND, 404),
    "affidavit.core.privacy.SubjectBusy": (USAGE_OR_STORE, 409),
    "affidavit.core.privacy.MasterKeyError": (USAGE_OR_STORE, 422),
    "affidavit.core.privacy.SealedValueError": (FAILED, 409),
    "affidavit.integrations.mcp.client.McpConnectionError": (USAGE_OR_STORE, 400),
    "affidavit.mcp.http_gate.TooManySessions": (USAGE_OR_STORE, 429),
    "affidavit.packs._errors.PackError": (USAGE_OR_STORE, 409),
    "affidavit.packs._errors.UnfinishedJobError": (USAGE_OR_STORE, 409),
    "affidavit.packs._errors.PackExistsError": (USAGE_OR_STORE, 409),
    "affidavit.packs._errors.TraceStateError": (USAGE_OR_STORE, 409),
    "affidavit.packs._errors.PackArchiveError": (USAGE_OR_STORE, 400),
    "affidavit.record._args.ArgsResolutionError": (USAGE_OR_STORE, 422),
    "affidavit.retention._check.JobArchived": (NOT_FOUND, 404),
    "affidavit.retention._policy.RetentionError": (USAGE_OR_STORE, 409),
    "affidavit.runtime._decisions.InvalidStateError": (USAGE_OR_STORE, 409),
    "affidavit.runtime._schedules.ScheduleNotFound": (NOT_FOUND, 404),
    "affidavit.runtime._sdk.ToolError": (USAGE_OR_STORE, 400),
    "affidavit.runtime._sdk.ToolCancelled": (USAGE_OR_STORE, 409),
    "affidavit.tlog._audit.EntriesMismatch": (FAILED, 400),
    "affidavit.tlog._audit.ForkDetected": (FAILED, 400),
    "affidavit.tlog._audit.AuditInterrupted": (USAGE_OR_STORE, 400),
    "affidavit.tlog._disclose.StepNotFound": (NOT_FOUND, 404),
    "affidavit.tlog._disclose.NotDisclosable": (NOT_FOUND, 400),
    "affidavit.tlog._entries.EntriesError": (FAILED, 400),
    "affidavit.tlog._fetch.LogReadError": (USAGE_OR_STORE, 400),
    "affidavit.tlog._fetch.NoProof": (USAGE_OR_STORE, 400),
    "affidavit.tlog._fetch.AnswerTooBig": (USAGE_OR_STORE, 400),
    "affidavit.store.audit_index.AuditStateError": (USAGE_OR_STORE, 400),
    "affidavit.tlog._log.NotInLog": (NOT_FOUND, 404),
    "affidavit.tlog._log.LogError": (USAGE_OR_STORE, 400),
    "affidavit.tlog._witness.DuplicateJob": (FAILED, 400),
    "affidavit.tlog._witness.MalformedLeaf": (FAILED, 400),
    "affidavit.tlog._witness.WitnessError": (USAGE_OR_STORE, 400),
}


def class_key(cls: type) -> str:
    """The key of ``cls`` in :data:`FACES`."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _mapping(exc: AffidavitError) -> tuple[int, int]:
    for cls in type(exc).__mro__:
        found = FACES.get(class_key(cls))
        if found is not None:
            return found
    return FACES[class_key(AffidavitError)]  # (not reached: every error derives from it)


def exit_code_for(exc: AffidavitError) -> int:
    """The CLI's exit code for ``exc``."""
    return _mapping(exc)[0]


def http_status_for(exc: AffidavitError) -> int:
    """The HTTP status for ``exc`` (the API's, and ``affidavit mcp``'s over HTTP). A claim slot
    that is not free is the agent's own cap (429) or the server's (503)."""
    from affidavit.faces.limits import ClaimsBusy  # (the HTTP faces have it loaded already)

    if isinstance(exc, ClaimsBusy) and exc.per_agent:
        return 429
    return _mapping(exc)[1]
