"""Every error of the HTTP API as ``{"error": {"code", "message", "hint"}}`` with a status code
that says what kind of problem it is."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from affidavit.api.auth import Forbidden, Unauthorized
from affidavit.api.limits import ClaimsBusy, PayloadTooLarge
from affidavit.api.ratelimit import RateLimited
from affidavit.claims.bwrap import SandboxUnavailable
from affidavit.core.errors import (
    AffidavitError,
    AgentExistsError,
    AuthorizationError,
    CanonicalizationError,
    ConfigError,
    ConflictError,
    IdempotencyConflict,
    InvalidEventError,
    NotFound,
    PlanError,
    ReplayError,
    SelfVerificationError,
    SignalPayloadError,
    SignalRejected,
    StoreError,
    TamperedRecordError,
    ValidationError,
)
from affidavit.packs import PackError, PackExistsError, UnfinishedJobError
from affidavit.runtime.args import ArgsResolutionError
from affidavit.runtime.decisions import InvalidStateError

# First match wins: subclasses before their bases (ConflictError is a StoreError).
STATUS: tuple[tuple[type[AffidavitError], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (SandboxUnavailable, 503),
    (PayloadTooLarge, 413),
    (SelfVerificationError, 403),
    (AuthorizationError, 403),
    (ValidationError, 422),
    (AgentExistsError, 409),
    (NotFound, 404),
    (RateLimited, 429),
    (ConflictError, 409),
    (IdempotencyConflict, 409),
    (InvalidStateError, 409),
    (SignalRejected, 409),
    (ReplayError, 409),
    (TamperedRecordError, 409),  # a row changed outside affidavit: as a log that does not replay
    (UnfinishedJobError, 409),
    (PackExistsError, 409),
    (PackError, 409),  # the job's record does not verify: it refuses a pack as its state would
    (PlanError, 422),
    (ArgsResolutionError, 422),
    (CanonicalizationError, 422),
    (SignalPayloadError, 422),
    (InvalidEventError, 422),
    (ConfigError, 422),
    (StoreError, 503),
)


def status_for(exc: AffidavitError) -> int:
    if isinstance(exc, ClaimsBusy):  # the agent's own cap, or the server's
        return 429 if exc.per_agent else 503
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 400


# What FastAPI says of a body that its JSON parser could not read for a reason other than bad
# JSON (a RecursionError, for one nested thousands of levels deep).
UNPARSABLE_BODY = "There was an error parsing the body"


def error_body(code: str, message: str, hint: str = "") -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "hint": hint}}


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the one shape."""

    @app.exception_handler(AffidavitError)
    async def affidavit_error(request: Request, exc: AffidavitError) -> JSONResponse:
        headers: dict[str, str] = {}
        if isinstance(exc, Unauthorized):
            headers["WWW-Authenticate"] = "Bearer"
        if isinstance(exc, RateLimited | ClaimsBusy):
            headers["Retry-After"] = str(max(1, round(exc.retry_after + 0.5)))
        body = error_body(exc.code, exc.message, exc.hint)
        return JSONResponse(body, status_code=status_for(exc), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return JSONResponse(
            error_body(
                "invalid_request",
                f"the request is not valid: {problems}",
                "See the request schema at /docs.",
            ),
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == UNPARSABLE_BODY:
            # FastAPI's answer to a body its JSON parser gave up on other than as malformed JSON
            # (which is a 422 like any invalid request): nested too deeply, in practice
            return JSONResponse(
                error_body(
                    "invalid_request",
                    "the request body could not be parsed (a JSON document nested too deeply?)",
                    "Send one JSON document; values a job records may be nested at most 252 "
                    "levels deep. See the request schema at /docs.",
                ),
                status_code=422,
            )
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            error_body(code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )
