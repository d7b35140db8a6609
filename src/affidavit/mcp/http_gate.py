"""What an HTTP request to ``affidavit mcp`` may cost the server, checked before the MCP SDK
sees it (the HTTP API's own auth, rate limit and body cap, reused):

1. every request is authenticated from its headers (``Authorization: Bearer <key>``) before a
   byte of its body is read: 401 without a valid key, so ``initialize`` and ``tools/list``
   need one too and no session is opened for a stranger;
2. each key is rate limited as on the HTTP API (:class:`~affidavit.faces.ratelimit.Limiter`):
   429 with ``Retry-After``;
3. a body above the cap is refused (413, :class:`~affidavit.faces.limits.BodyGuard`): a declared
   ``Content-Length`` at once, a streamed body once it passes the cap;
4. a key holds at most ``per_key`` sessions: a request that would open one more is refused
   (429 with ``Retry-After``: when the oldest idle one expires), the open ones are kept;
   ``DELETE`` with the session id closes one. A session with no request in flight for
   ``idle_seconds`` is closed by the SDK (its id answers 404 after) and stops counting.

A session belongs to the key that opened it: a request with another key's session id is
answered 404, as for an unknown session.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from affidavit.core.errors import AffidavitError, ConfigError
from affidavit.faces.auth import Caller, Unauthorized, authenticate
from affidavit.faces.limits import DEFAULT_MAX_BODY, BodyGuard, send_error
from affidavit.faces.ratelimit import DEFAULT_RATE_LIMIT, Limiter, RateLimit, RateLimited
from affidavit.store import Store

DEFAULT_MAX_SESSIONS = 1024  # of all keys together
DEFAULT_SESSIONS_PER_KEY = 16
DEFAULT_SESSION_IDLE_SECONDS = 600.0
SESSION_HEADER = b"mcp-session-id"
_AUTH_THREADS = 8
_GRACE = 1.0  # a session counts this much longer than the SDK keeps it: never one too many


class TooManySessions(AffidavitError):
    code = "too_many_sessions"
    default_hint = (
        "Reuse an open session, close one with DELETE (its Mcp-Session-Id), or retry after "
        "the number of seconds in the Retry-After header, when the oldest idle one expires."
    )

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """How many MCP sessions one key may hold, and how long an idle one lives."""

    per_key: int = DEFAULT_SESSIONS_PER_KEY
    idle_seconds: float = DEFAULT_SESSION_IDLE_SECONDS

    def __post_init__(self) -> None:
        if self.per_key < 1:
            raise ConfigError(f"sessions per key must be at least 1, not {self.per_key}")
        if not (math.isfinite(self.idle_seconds) and self.idle_seconds > 0):
            raise ConfigError(f"the session idle time must be positive, not {self.idle_seconds}")


@dataclass
class _Session:
    last: float  # when its last request ended (or it opened)
    in_flight: int = 0


@dataclass
class _Key:
    sessions: dict[str, _Session] = field(default_factory=dict)
    opening: int = 0  # requests without a session id being served (each may open one)


class SessionBook:
    """The sessions of each key, as this gate sees them open, serve requests and end."""

    def __init__(self, limits: SessionLimits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self._clock = clock
        self._keys: dict[str, _Key] = {}
        self._lock = threading.Lock()

    def _live(self, key: _Key, now: float) -> None:
        ttl = self.limits.idle_seconds + _GRACE
        for sid in [s for s, v in key.sessions.items() if not v.in_flight and now - v.last > ttl]:
            del key.sessions[sid]

    def reserve(self, key_id: str) -> None:
        """Room for one more session of ``key_id`` while its opening request is served.

        Raises:
            TooManySessions: the key holds (or is opening) ``per_key`` sessions.
        """
        now = self._clock()
        with self._lock:
            key = self._keys.setdefault(key_id, _Key())
            self._live(key, now)
            if len(key.sessions) + key.opening < self.limits.per_key:
                key.opening += 1
                return
            idle = [v.last for v in key.sessions.values() if not v.in_flight]
            wait = min(idle) + self.limits.idle_seconds + _GRACE - now if idle else 1.0
            raise TooManySessions(
                f"this key already holds {self.limits.per_key} MCP sessions, its limit",
                retry_after=max(1.0, wait),
            )

    def opened(self, key_id: str, session_id: str | None) -> None:
        """The opening request reserved for ``key_id`` ended; ``session_id``: the session it
        opened, if any."""
        with self._lock:
            key = self._keys[key_id]
            key.opening -= 1
            if session_id is not None:
                key.sessions[session_id] = _Session(self._clock())
            elif not key.sessions and not key.opening:
                del self._keys[key_id]

    def begin(self, key_id: str, session_id: str) -> None:
        with self._lock:
            found = self._keys.get(key_id)
            if found is not None and session_id in found.sessions:
                found.sessions[session_id].in_flight += 1

    def end(self, key_id: str, session_id: str, *, closed: bool) -> None:
        with self._lock:
            found = self._keys.get(key_id)
            session = found.sessions.get(session_id) if found is not None else None
            if found is None or session is None:
                return
            session.in_flight -= 1
            session.last = self._clock()
            if closed and not session.in_flight:
                del found.sessions[session_id]
            if not found.sessions and not found.opening:
                del self._keys[key_id]


class McpGate:
    """ASGI middleware in front of the MCP SDK's streamable HTTP app (module docs)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: Store,
        limiter: Limiter | None,
        sessions: SessionBook,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.app = BodyGuard(app, store=store, max_body=max_body, authenticated=True)
        self.store = store
        self.limiter = limiter
        self.sessions = sessions
        self._auth_threads = anyio.CapacityLimiter(_AUTH_THREADS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan: the SDK's session manager
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        authorization = headers.get(b"authorization")
        try:
            caller = await anyio.to_thread.run_sync(
                authenticate,
                self.store,
                authorization.decode("latin-1") if authorization is not None else None,
                limiter=self._auth_threads,
            )
            if self.limiter is not None:
                self.limiter.take(caller.key_id)
        except Unauthorized as exc:
            await send_error(send, exc, {"www-authenticate": "Bearer"})
            return
        except RateLimited as exc:
            await send_error(send, exc, _retry_after(exc.retry_after))
            return
        scope = {**scope, "user": _user(caller)}  # the SDK ties each session to its key
        session_id = headers.get(SESSION_HEADER)
        if session_id is None:
            await self._opening(caller, scope, receive, send)
        else:
            await self._in_session(caller, session_id.decode("latin-1"), scope, receive, send)

    async def _opening(self, caller: Caller, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":  # only an initialize (a POST) opens a session
            await self.app(scope, receive, send)
            return
        try:
            self.sessions.reserve(caller.key_id)
        except TooManySessions as exc:
            await send_error(send, exc, _retry_after(exc.retry_after))
            return
        opened: list[str] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                found = dict(message.get("headers", [])).get(SESSION_HEADER)
                if found is not None:
                    opened.append(found.decode("latin-1"))
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self.sessions.opened(caller.key_id, opened[0] if opened else None)

    async def _in_session(
        self, caller: Caller, session_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        status: list[int] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        self.sessions.begin(caller.key_id, session_id)
        try:
            await self.app(scope, receive, watch)
        finally:
            gone = scope["method"] == "DELETE" and bool(status) and status[0] < 400
            gone = gone or (bool(status) and status[0] == 404)  # expired, or never ours
            self.sessions.end(caller.key_id, session_id, closed=gone)


def _retry_after(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(1, round(seconds + 0.5)))}


def _user(caller: Caller) -> AuthenticatedUser:
    """The caller as the SDK's authenticated user: its API key id identifies it (never the
    secret)."""
    return AuthenticatedUser(
        AccessToken(token=caller.key_id, client_id=caller.key_id, scopes=[caller.role])
    )


def gated_http_app(
    server: MCPServer,
    store: Store,
    *,
    path: str = "/mcp",
    host: str = "127.0.0.1",
    rate_limit: RateLimit | None = DEFAULT_RATE_LIMIT,
    max_body: int = DEFAULT_MAX_BODY,
    sessions: SessionLimits | None = None,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
) -> ASGIApp:
    """``server``'s streamable HTTP app behind the gate: keys, rate limit (``None``: none),
    body cap, sessions per key and their idle time (module docs); ``max_sessions`` bounds the
    sessions of all keys together (503 beyond, from the SDK)."""
    limits = sessions or SessionLimits()
    app = server.streamable_http_app(
        streamable_http_path=path,
        host=host,
        session_idle_timeout=limits.idle_seconds,
        max_request_body_size=max_body,
        max_sessions=max_sessions,
    )
    return McpGate(
        app,
        store=store,
        limiter=Limiter(rate_limit) if rate_limit is not None else None,
        sessions=SessionBook(limits),
        max_body=max_body,
    )
