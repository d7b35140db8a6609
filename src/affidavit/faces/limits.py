"""What one request may cost the server: its body, and the claims it runs.

1. :class:`BodyGuard` (ASGI middleware, outermost): a request that carries a body is
   authenticated from its headers **before a byte of the body is read** (401 otherwise); a
   declared ``Content-Length`` above the limit is refused at once, and a streamed body is read
   only up to the limit (413, the JSON error envelope). What passes is at most ``max_body``
   bytes, so parsing it on the event loop is bounded.
2. :class:`ClaimSlots`: claim commands run on their own worker threads, never the request
   threads, at most ``max_concurrent`` at once and ``per_agent`` per verifying agent; a claim
   that finds no free slot is refused at once (429 for the agent's cap, 503 for the global one,
   both with ``Retry-After``), so a flood of claims never queues behind, or in front of, other
   requests. ``max_timeout_s`` caps every claim's timeout.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from affidavit.core.errors import AffidavitError, ConfigError
from affidavit.faces.auth import Unauthorized, authenticate
from affidavit.faces.errors import http_status_for
from affidavit.store import Store

DEFAULT_MAX_BODY = 1 << 20
DEFAULT_CLAIM_CONCURRENCY = 8
DEFAULT_CLAIM_PER_AGENT = 2
DEFAULT_CLAIM_MAX_TIMEOUT_S = 120.0
_AUTH_THREADS = 8
T = TypeVar("T")


class PayloadTooLarge(AffidavitError):
    code = "payload_too_large"
    default_hint = "Send a smaller request body; the server's limit is set by --max-body-bytes."


class ClaimsBusy(AffidavitError):
    """No claim slot is free: the agent's own (429) or the server's (503)."""

    code = "claims_busy"
    default_hint = "Retry after the number of seconds in the Retry-After header."

    def __init__(self, message: str, *, retry_after: float, per_agent: bool) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.per_agent = per_agent


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """How many claims run at once (in all, and per verifying agent), and the longest timeout
    a claim may ask for."""

    max_concurrent: int = DEFAULT_CLAIM_CONCURRENCY
    per_agent: int = DEFAULT_CLAIM_PER_AGENT
    max_timeout_s: float = DEFAULT_CLAIM_MAX_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_concurrent < 1 or self.per_agent < 1:
            raise ConfigError("claim concurrency limits must be at least 1")
        if not self.max_timeout_s > 0:
            raise ConfigError(f"the claim timeout cap must be positive, not {self.max_timeout_s}")


class ClaimSlots:
    """Admission and threads for claim commands (see the module docs)."""

    def __init__(self, limits: ClaimLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._running = 0
        self._by_agent: dict[str, int] = {}
        # The claims' own threads: the request threads stay free for everything else.
        self._threads = anyio.CapacityLimiter(limits.max_concurrent)

    def _take(self, agent_id: str) -> None:
        with self._lock:
            if self._by_agent.get(agent_id, 0) >= self.limits.per_agent:
                raise ClaimsBusy(
                    f"agent {agent_id!r} already runs {self.limits.per_agent} claim(s), its limit",
                    retry_after=1.0,
                    per_agent=True,
                )
            if self._running >= self.limits.max_concurrent:
                raise ClaimsBusy(
                    f"the server already runs {self.limits.max_concurrent} claims, its limit",
                    retry_after=2.0,
                    per_agent=False,
                )
            self._running += 1
            self._by_agent[agent_id] = self._by_agent.get(agent_id, 0) + 1

    def _give(self, agent_id: str) -> None:
        with self._lock:
            self._running -= 1
            left = self._by_agent[agent_id] - 1
            if left:
                self._by_agent[agent_id] = left
            else:
                del self._by_agent[agent_id]

    async def run(self, agent_id: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (a claim) on a claim thread, if a slot is free.

        Raises:
            ClaimsBusy: no slot for this agent, or none at all (nothing ran).
        """
        self._take(agent_id)
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._threads)
        finally:
            self._give(agent_id)

    def timeout(self, asked: float | None, default: float) -> float:
        """The timeout a claim gets: what it asked for, or the default, capped."""
        return min(asked if asked is not None else default, self.limits.max_timeout_s)


class BodyGuard:
    """ASGI middleware: authenticate before the body, and cap its size (module docs, 1)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: Store,
        max_body: int = DEFAULT_MAX_BODY,
        authenticated: bool = False,
    ) -> None:
        """``authenticated``: an outer middleware has authenticated every request already
        (the MCP server's gate): only the size is checked here."""
        if max_body < 1:
            raise ConfigError(f"the body size limit must be positive, not {max_body}")
        self.app = app
        self.store = store
        self.max_body = max_body
        self.authenticated = authenticated
        self._auth_threads = anyio.CapacityLimiter(_AUTH_THREADS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        length = headers.get(b"content-length")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        if not chunked and length in (None, b"0"):
            await self.app(scope, receive, send)  # no body: the route authenticates
            return
        # (1) who is it, from the headers alone
        authorization = headers.get(b"authorization")
        try:
            if not self.authenticated:
                await anyio.to_thread.run_sync(
                    authenticate,
                    self.store,
                    authorization.decode("latin-1") if authorization is not None else None,
                    limiter=self._auth_threads,
                )
        except Unauthorized as exc:
            await send_error(send, exc, {"www-authenticate": "Bearer"})
            return
        # (2) the declared size, then (3) what actually arrives
        if length is not None and not chunked:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared < 0:
                await send_error(send, AffidavitError("invalid Content-Length"))
                return
            if declared > self.max_body:
                await send_error(send, self._too_large(declared))
                return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await send_error(send, self._too_large(None))
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send)

    def _too_large(self, declared: int | None) -> PayloadTooLarge:
        size = f"{declared} bytes" if declared is not None else "more"
        return PayloadTooLarge(
            f"the request body is too large ({size}; the limit is {self.max_body} bytes)"
        )


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # the disconnect, when it comes

    return replay


async def send_error(
    send: Send, exc: AffidavitError, headers: dict[str, str] | None = None
) -> None:
    """Answer with the HTTP status of ``exc`` (:func:`~affidavit.faces.errors.http_status_for`)
    and its JSON error envelope; the connection closes (a body not read stays unread)."""
    status = http_status_for(exc)
    payload: dict[str, Any] = {"error": exc.to_dict()}
    body = json.dumps(payload).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the rest of the body is never read
    ]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class StreamsBusy(AffidavitError):
    """Every stream slot of the server is taken (``GET /api/jobs/{id}/stream``)."""

    code = "streams_busy"
    default_hint = "Retry in a few seconds, or read the log a page at a time (/events)."


class StreamSlots:
    """Live streams of job logs: at most ``max_connections`` open at once, each open at most
    ``max_seconds`` (the reader reconnects where it was), a heartbeat every
    ``heartbeat_seconds`` while it is quiet."""

    def __init__(
        self,
        max_connections: int = 64,
        max_seconds: float = 300.0,
        heartbeat_seconds: float = 15.0,
    ) -> None:
        if max_connections < 1 or max_seconds <= 0 or heartbeat_seconds <= 0:
            raise ConfigError("stream limits must be positive")
        self.max_connections = max_connections
        self.max_seconds = max_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self._open = 0
        self._lock = threading.Lock()

    def take(self) -> None:
        """Take a slot for a stream that starts (:meth:`give_back` it when it ends).

        Raises:
            StreamsBusy: every slot is taken.
        """
        with self._lock:
            if self._open >= self.max_connections:
                raise StreamsBusy(f"the server has {self.max_connections} streams open already")
            self._open += 1

    def give_back(self) -> None:
        with self._lock:
            self._open -= 1
