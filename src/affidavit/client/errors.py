"""The server's errors, raised on the client's side as the classes the server raised.

The API answers every error as ``{"error": {"code", "message", "hint"}}`` (docs/api.md); the
client raises the :class:`~affidavit.core.errors.AffidavitError` subclass whose ``code`` that
is, with the server's message and hint, so that ``except affidavit.JobNotFound`` means the same
against a served affidavit as against a local :class:`~affidavit.Runtime`. The classes the
client knows are those it can import without the server's layers (the store, the runtime, the
packs, the log): ``affidavit.core``'s errors (with the subjects' of
:mod:`affidavit.core.privacy`) and the faces' (``unauthorized``, ``forbidden``,
``rate_limited``). Any other code — a pack's ``job_not_finished``, a resume's
``invalid_state`` — arrives as :class:`ApiError`, with the server's code, message, hint and the
HTTP status.

An error rebuilt this way carries ``code``, ``message`` and ``hint``; the attributes a class
sets from its constructor's arguments (``JobNotFound.job_id``, ``ConflictError.expected``)
are not sent by the server and are not set, except ``retry_after`` of :class:`RateLimited`
(from the ``Retry-After`` header).
"""

from __future__ import annotations

from typing import Any

import httpx

from affidavit.core import errors as core_errors
from affidavit.core.approvals import ApprovalRefused
from affidavit.core.errors import AffidavitError
from affidavit.core.inputs import InputTooLarge
from affidavit.core.privacy import (
    MasterKeyError,
    SealedValueError,
    SubjectBusy,
    SubjectError,
    SubjectNotFound,
)
from affidavit.core.tags import InvalidTags
from affidavit.faces.auth import ApiKeyNotFound, Forbidden, Unauthorized
from affidavit.faces.ratelimit import RateLimited

# How much of a body that is not the API's error envelope an ApiError quotes.
_QUOTED = 300


class ApiError(AffidavitError):
    """The server answered with an error whose class the client does not have (its ``code``
    is the server's), or with something that is not the API's error envelope (a proxy's page,
    an internal error). ``status`` is the HTTP status."""

    code = "api_error"
    default_hint = "See the server's docs/api.md for the error's code; nothing was changed here."

    def __init__(self, message: str, *, status: int, code: str | None = None, hint: str = ""):
        super().__init__(message, hint=hint or None)
        self.status = status
        if code:
            self.code = code


class ServerUnreachable(AffidavitError):
    """The server could not be reached, or did not answer in time. A request that timed out
    after it was sent may or may not have taken effect: submit with an idempotency key, and
    signals are idempotent, so that sending it again is safe."""

    code = "server_unreachable"
    default_hint = (
        "Is `affidavit serve` running at that URL, and reachable from here? Retry once it is."
    )


def _known_classes() -> dict[str, type[AffidavitError]]:
    """Each code the API answers with that the client has a class for → that class. A code
    that several classes share takes the first listed: the faces' ``forbidden`` (a key's role)
    before the claims' (a verifier's)."""
    classes: list[type[AffidavitError]] = [
        Unauthorized,
        Forbidden,
        ApiKeyNotFound,
        RateLimited,
        ApprovalRefused,
        InputTooLarge,
        InvalidTags,
        SubjectError,
        SubjectNotFound,
        SubjectBusy,
        MasterKeyError,
        SealedValueError,
    ]
    classes += [
        value
        for value in vars(core_errors).values()
        if isinstance(value, type) and issubclass(value, AffidavitError)
    ]
    found: dict[str, type[AffidavitError]] = {}
    for cls in classes:
        found.setdefault(cls.code, cls)  # (a subclass that keeps its base's code: the base)
    del found[AffidavitError.code]  # ("error": no class of the API's answers is the bare root)
    return found


BY_CODE = _known_classes()


def rebuilt(cls: type[AffidavitError], message: str, hint: str) -> AffidavitError:
    """An instance of ``cls`` with the server's ``message`` and ``hint``. The class's own
    constructor is not called: it takes what the server does not send (a job, a version)."""
    exc = cls.__new__(cls)
    AffidavitError.__init__(exc, message, hint=hint)
    return exc


def error_from(response: httpx.Response) -> AffidavitError:
    """The error an error ``response`` of the API stands for (see the module docstring)."""
    detail = _envelope(response)
    if detail is None:
        text = response.text[:_QUOTED].strip()
        return ApiError(
            f"HTTP {response.status_code} from {response.request.method} "
            f"{response.request.url.path}" + (f": {text}" if text else ""),
            status=response.status_code,
            code="http_error",
            hint="The answer is not the API's error envelope: is the URL an affidavit server's "
            "(`affidavit serve`), and is the server healthy (GET /health)?",
        )
    code, message, hint = detail
    cls = BY_CODE.get(code)
    if cls is None:
        return ApiError(message, status=response.status_code, code=code, hint=hint)
    exc = rebuilt(cls, message, hint)
    if isinstance(exc, RateLimited):
        exc.retry_after = _retry_after(response)
    return exc


def _envelope(response: httpx.Response) -> tuple[str, str, str] | None:
    try:
        body: Any = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    code, message, hint = (error.get(k) for k in ("code", "message", "hint"))
    if not (isinstance(code, str) and isinstance(message, str)):
        return None
    return code, message, hint if isinstance(hint, str) else ""


def _retry_after(response: httpx.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


def unreachable(url: str, exc: httpx.TransportError) -> ServerUnreachable:
    """The error of a request to ``url`` that got no answer."""
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    return ServerUnreachable(f"the request to {url} {kind}: {str(exc) or type(exc).__name__}")
