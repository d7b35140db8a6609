"""Every error of the HTTP API as ``{"error": {"code", "message", "hint"}}`` with a status code
that says what kind of problem it is."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from affidavit.core.errors import AffidavitError
from affidavit.faces.auth import Unauthorized
from affidavit.faces.errors import http_status_for
from affidavit.faces.limits import ClaimsBusy
from affidavit.faces.ratelimit import RateLimited


def status_for(exc: AffidavitError) -> int:
    """The HTTP status of ``exc``: the faces' table (:mod:`affidavit.faces.errors`)."""
    return http_status_for(exc)


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
