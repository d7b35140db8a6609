"""One table in the faces maps each error to the CLI's exit code and the HTTP status of the API
and of ``affidavit mcp`` (:mod:`affidavit.faces.errors`); the errors themselves carry neither."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import affidavit
from affidavit.claims.bwrap import SandboxUnavailable
from affidavit.core import errors as e
from affidavit.core.privacy import SubjectBusy, SubjectError, SubjectNotFound
from affidavit.core.signing import SigningKeyError
from affidavit.faces.auth import Forbidden, Unauthorized
from affidavit.faces.errors import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_USAGE_OR_STORE,
    FACES,
    class_key,
    exit_code_for,
    http_status_for,
)
from affidavit.faces.limits import ClaimsBusy, PayloadTooLarge
from affidavit.faces.ratelimit import RateLimited
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
    (SubjectError, EXIT_USAGE_OR_STORE, 422),
    (SubjectNotFound, EXIT_NOT_FOUND, 404),
    (SubjectBusy, EXIT_USAGE_OR_STORE, 409),
]


@pytest.mark.parametrize(("cls", "exit_code", "status"), CASES, ids=[c[0].__name__ for c in CASES])
def test_an_error_class_maps_to_its_exit_code_and_http_status(
    cls: type[e.AffidavitError], exit_code: int, status: int
) -> None:
    exc = cls.__new__(cls)  # (constructors differ; the mapping reads only the class)
    assert exit_code_for(exc) == exit_code
    assert http_status_for(exc) == status


def test_busy_claims_are_the_agents_429_or_the_servers_503() -> None:
    assert http_status_for(ClaimsBusy("busy", retry_after=1, per_agent=True)) == 429
    assert http_status_for(ClaimsBusy("busy", retry_after=1, per_agent=False)) == 503


def every_error_class() -> list[type[e.AffidavitError]]:
    """Every AffidavitError subclass the package defines (each module imported: an error
    defined in a module no face has loaded yet counts too)."""
    for module in pkgutil.walk_packages(affidavit.__path__, "affidavit."):
        if not module.name.endswith("__main__"):  # (that one runs the CLI)
            importlib.import_module(module.name)
    found: list[type[e.AffidavitError]] = []
    todo: list[type[e.AffidavitError]] = [e.AffidavitError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("affidavit.") and cls not in found:
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_has_its_own_row_and_every_row_a_class() -> None:
    """A new error (or one moved to another module) without its row in the faces' table would
    silently take its base's exit code and status: each class affidavit defines has one."""
    classes = every_error_class()
    assert len(classes) > 50
    missing = sorted(class_key(c) for c in classes if class_key(c) not in FACES)
    assert missing == []
    stale = sorted(set(FACES) - {class_key(c) for c in classes})
    assert stale == []


def test_an_error_class_without_a_row_takes_its_nearest_bases_mapping() -> None:
    class Mine(e.JobNotFound):  # (a user's own subclass)
        pass

    exc = Mine("x")
    assert (exit_code_for(exc), http_status_for(exc)) == (EXIT_NOT_FOUND, 404)


def test_no_error_class_carries_a_faces_attribute() -> None:
    """The exit code and the HTTP status belong to the faces, not to the error classes."""
    carrying = [
        class_key(c) for c in every_error_class() if {"exit_code", "http_status"} & set(vars(c))
    ]
    assert carrying == []
