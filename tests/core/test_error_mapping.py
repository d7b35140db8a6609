"""One mapping from an error to the CLI's exit code and the HTTP API's status: attributes of
the error's class, read by both faces."""

from __future__ import annotations

import pytest

from affidavit.api.auth import Forbidden, Unauthorized
from affidavit.api.errors import status_for
from affidavit.api.limits import ClaimsBusy, PayloadTooLarge
from affidavit.api.ratelimit import RateLimited
from affidavit.claims.bwrap import SandboxUnavailable
from affidavit.cli.output import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_USAGE_OR_STORE,
    exit_code_for,
)
from affidavit.core import errors as e
from affidavit.core.signing import SigningKeyError
from affidavit.packs import PackError, PackExistsError, UnfinishedJobError
from affidavit.record._args import ArgsResolutionError
from affidavit.runtime._decisions import InvalidStateError

CASES: list[tuple[type[e.AffidavitError], int, int]] = [
    (e.AffidavitError, EXIT_USAGE_OR_STORE, 400),
    (e.ConfigError, EXIT_USAGE_OR_STORE, 422),
    (e.ClockSkewError, EXIT_USAGE_OR_STORE, 422),
    (e.UnsupportedDatabaseURL, EXIT_USAGE_OR_STORE, 422),
    (SigningKeyError, EXIT_USAGE_OR_STORE, 422),
    (e.CanonicalizationError, EXIT_USAGE_OR_STORE, 422),
    (e.PlanError, EXIT_USAGE_OR_STORE, 422),
    (e.CycleError, EXIT_USAGE_OR_STORE, 422),
    (e.StoreError, EXIT_USAGE_OR_STORE, 503),
    (e.StoreUnavailable, EXIT_USAGE_OR_STORE, 503),
    (e.MigrationError, EXIT_USAGE_OR_STORE, 503),
    (e.FencedError, EXIT_USAGE_OR_STORE, 503),
    (e.ConflictError, EXIT_USAGE_OR_STORE, 409),
    (e.IdempotencyConflict, EXIT_USAGE_OR_STORE, 409),
    (e.NotFound, EXIT_NOT_FOUND, 404),
    (e.JobNotFound, EXIT_NOT_FOUND, 404),
    (e.AgentNotFound, EXIT_NOT_FOUND, 404),
    (e.WaitTimeout, EXIT_USAGE_OR_STORE, 400),
    (e.InvalidEventError, EXIT_USAGE_OR_STORE, 422),
    (e.VerificationError, EXIT_FAILED, 400),
    (e.TamperedRecordError, EXIT_FAILED, 409),
    (e.ReplayError, EXIT_USAGE_OR_STORE, 409),
    (e.UnreadableEventError, EXIT_USAGE_OR_STORE, 409),
    (e.SignalRejected, EXIT_FAILED, 409),
    (e.SignalPayloadError, EXIT_USAGE_OR_STORE, 422),
    (e.AgentExistsError, EXIT_USAGE_OR_STORE, 409),
    (e.ClaimRejected, EXIT_REFUSED, 400),
    (e.SelfVerificationError, EXIT_REFUSED, 403),
    (e.ValidationError, EXIT_REFUSED, 422),
    (e.InvalidClaim, EXIT_REFUSED, 422),
    (e.CommandNotAllowed, EXIT_REFUSED, 422),
    (e.AuthorizationError, EXIT_REFUSED, 403),
    (e.VerifierRoleForbidden, EXIT_REFUSED, 403),
    (e.NamespaceForbidden, EXIT_REFUSED, 403),
    (SandboxUnavailable, EXIT_REFUSED, 503),
    (InvalidStateError, EXIT_USAGE_OR_STORE, 409),
    (ArgsResolutionError, EXIT_USAGE_OR_STORE, 422),
    (Unauthorized, EXIT_USAGE_OR_STORE, 401),
    (Forbidden, EXIT_USAGE_OR_STORE, 403),
    (RateLimited, EXIT_USAGE_OR_STORE, 429),
    (PayloadTooLarge, EXIT_USAGE_OR_STORE, 413),
    (PackError, EXIT_USAGE_OR_STORE, 409),
    (PackExistsError, EXIT_USAGE_OR_STORE, 409),
    (UnfinishedJobError, EXIT_USAGE_OR_STORE, 409),
]


@pytest.mark.parametrize(("cls", "exit_code", "status"), CASES, ids=[c[0].__name__ for c in CASES])
def test_an_error_class_carries_its_exit_code_and_http_status(
    cls: type[e.AffidavitError], exit_code: int, status: int
) -> None:
    exc = cls.__new__(cls)  # (constructors differ; the mapping reads only the class)
    assert exit_code_for(exc) == cls.exit_code == exit_code
    assert status_for(exc) == cls.http_status == status


def test_busy_claims_are_the_agents_429_or_the_servers_503() -> None:
    assert status_for(ClaimsBusy("busy", retry_after=1, per_agent=True)) == 429
    assert status_for(ClaimsBusy("busy", retry_after=1, per_agent=False)) == 503
