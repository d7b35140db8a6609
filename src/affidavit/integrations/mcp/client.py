"""MCP servers' tools as affidavit tools: every ``tools/call`` one step through the ledger.

:func:`load_servers` connects to each server of a servers file (config.py), lists its tools
and registers each as ``mcp:SERVER/TOOL`` — a ``@tool`` (or ``@pure``) like any other, so a
plan node names it (``tool: "mcp:files/write_file"``) and an agent calls it. A call sends the
step's external idempotency key (``affidavit:<job>:<step>:<attempt>``) in the request's
``_meta`` (``affidavit/idempotency_key``, with ``affidavit/job_id`` and ``affidavit/step_id``),
so a server that deduplicates can; once the step committed its result is replayed and the
server is never asked again.

An invocation caught in flight (the worker died during the call) is resolved by the tool's
``reconcile`` tool, or by repeating it with the dead attempt's key when the server is
``idempotent``, or by its Python hook (``@affidavit.mcp_reconcile``, hooks.py), else by the
in-flight policy (park by default). A call whose answer was lost
to a broken connection is never retried blindly: the step fails ("outcome unknown") unless the
server is idempotent.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
from anyio.abc import TaskStatus
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from mcp_types import RequestParamsMeta

from affidavit import (
    AffidavitError,
    RetryableError,
    Tool,
    ToolContext,
    ToolRegistry,
    mcp_reconcile,
    pure,
    tool,
)
from affidavit.integrations.mcp.config import (
    McpServersFile,
    ServerConfig,
    ToolOptions,
    read_servers_file,
)
from affidavit.integrations.mcp.hooks import McpCall, ReconcileHook

__all__ = [
    "META_IDEMPOTENCY_KEY",
    "META_JOB_ID",
    "META_STEP_ID",
    "McpConnection",
    "McpConnectionError",
    "McpToolError",
    "load_servers",
    "tool_name",
]

META_IDEMPOTENCY_KEY = "affidavit/idempotency_key"
META_JOB_ID = "affidavit/job_id"
META_STEP_ID = "affidavit/step_id"
MAX_RESULT_BYTES = 8 * 1024 * 1024  # what one call's answer may be, as JSON
_CONNECT_TIMEOUT = 60.0


class McpConnectionError(AffidavitError):
    """The MCP server cannot be reached (nothing was sent)."""

    code = "mcp_connection_error"
    default_hint = "Check the server's command or URL in the MCP servers file."


class McpToolError(Exception):
    """The MCP server answered the call with an error (``isError``), or the call's outcome is
    unknown (its answer was lost). A permanent failure of the step."""


def tool_name(server: str, tool_name: str) -> str:
    """The affidavit tool name of an MCP server's tool: ``mcp:SERVER/TOOL``."""
    return f"mcp:{server}/{tool_name}"


class McpConnection:
    """One long-lived client connection to an MCP server, usable from any thread.

    The SDK's client is async; the connection runs it on an event loop of its own (an anyio
    blocking portal on a background thread), so synchronous tools call it. A connection that
    broke is opened again by the next call.
    """

    def __init__(self, name: str, config: ServerConfig) -> None:
        self.name = name
        self.config = config
        self._lock = threading.Lock()
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._client: Client | None = None
        self._stop: anyio.Event | None = None
        self._held: Future[None] | None = None

    def _target(self) -> Any:
        c = self.config
        if c.command is not None:
            return StdioServerParameters(
                command=c.command[0], args=c.command[1:], env=dict(c.env) or None, cwd=c.cwd
            )
        assert c.url is not None
        http = httpx2.AsyncClient(
            headers=dict(c.headers), timeout=httpx2.Timeout(30.0, read=c.timeout_seconds)
        )
        return streamable_http_client(c.url, http_client=http)

    async def _hold(self, *, task_status: TaskStatus[Client]) -> None:
        # The client is entered and left in this one task (anyio's cancel scopes are bound to
        # the task that opened them); calls from other tasks use it in between.
        self._stop = anyio.Event()
        async with Client(self._target(), read_timeout_seconds=self.config.timeout_seconds) as c:
            task_status.started(c)
            await self._stop.wait()

    def _connected(self) -> tuple[BlockingPortal, Client]:
        with self._lock:
            if self._portal is None:
                self._portal_cm = start_blocking_portal()
                self._portal = self._portal_cm.__enter__()
            if self._client is None or (self._held is not None and self._held.done()):
                try:
                    held, client = self._portal.start_task(self._hold)
                except Exception as exc:
                    raise McpConnectionError(
                        f"cannot connect to MCP server {self.name!r}: {exc!r}"
                    ) from exc
                self._held, self._client = held, client
            return self._portal, self._client

    def _drop(self) -> None:
        """Forget a broken client (the next call connects again)."""
        with self._lock:
            portal, stop = self._portal, self._stop
            self._client = None
        if portal is not None and stop is not None:
            with contextlib.suppress(Exception):  # the loop is gone already: nothing to stop
                portal.call(stop.set)

    def list_tools(self) -> list[str]:
        """The names of the server's tools (every page).

        Raises:
            McpConnectionError: the server cannot be reached.
        """
        portal, client = self._connected()

        async def every_page() -> list[str]:
            names: list[str] = []
            cursor: str | None = None
            for _ in range(1000):
                page = await client.list_tools(cursor=cursor)
                names += [t.name for t in page.tools]
                cursor = page.next_cursor
                if cursor is None:
                    break
            return names

        try:
            return portal.call(every_page)
        except Exception as exc:
            self._drop()
            raise McpConnectionError(
                f"tools/list of MCP server {self.name!r} failed: {exc!r}"
            ) from exc

    def call(
        self, tool: str, arguments: Mapping[str, Any], meta: Mapping[str, Any]
    ) -> CallToolResult:
        """One ``tools/call``.

        Raises:
            McpConnectionError: the server cannot be reached (nothing was sent).
            McpToolError: the connection broke after the call was sent (its outcome is
                unknown).
        """
        portal, client = self._connected()

        async def send() -> CallToolResult:
            return await client.call_tool(
                tool, dict(arguments), meta=cast(RequestParamsMeta, dict(meta))
            )

        try:
            return portal.call(send)
        except Exception as exc:
            self._drop()
            raise McpToolError(
                f"MCP call {tool_name(self.name, tool)} lost its answer ({exc!r}): whether the "
                "server acted is unknown"
            ) from exc

    def ask(self, tool: str, arguments: Mapping[str, Any]) -> Any:
        """One ``tools/call`` of ``tool`` (no idempotency key: a reconcile hook's read), its
        answer as :func:`_answer` records one.

        Raises:
            McpConnectionError: the server cannot be reached.
            McpToolError: the server answered with an error, or the answer was lost.
        """
        return _answer(self.call(tool, arguments, {}), tool_name(self.name, tool))

    def close(self) -> None:
        """Close the connection (a stdio server's process ends) and its event loop."""
        self._drop()
        with self._lock:
            cm, self._portal_cm, self._portal = self._portal_cm, None, None
            self._held = None
        if cm is not None:
            cm.__exit__(None, None, None)


_open: list[McpConnection] = []


@atexit.register
def _close_all() -> None:
    for connection in _open:
        with contextlib.suppress(Exception):  # a server already gone at exit
            connection.close()


def _answer(result: CallToolResult, name: str) -> Any:
    """A call's answer as it is recorded: the structured content when the server gives one,
    else ``{"content": [...]}`` (the content blocks as JSON)."""
    if result.is_error:
        text = " ".join(getattr(b, "text", "") for b in result.content).strip()
        raise McpToolError(f"MCP tool {name} answered with an error: {text[:2000]}")
    if result.structured_content is not None:
        answer: Any = result.structured_content
    else:
        answer = {
            "content": [
                b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content
            ]
        }
    size = len(json.dumps(answer, ensure_ascii=False).encode())
    if size > MAX_RESULT_BYTES:
        raise McpToolError(f"MCP tool {name} answered {size} bytes, more than {MAX_RESULT_BYTES}")
    return answer


def _meta(ctx: ToolContext) -> dict[str, Any]:
    return {
        META_IDEMPOTENCY_KEY: ctx.external_key,
        META_JOB_ID: ctx.job_id,
        META_STEP_ID: ctx.step_id,
    }


def _make_tool(
    connection: McpConnection, mcp_tool: str, options: ToolOptions
) -> tuple[str, Callable[..., Any], Callable[..., Any] | None]:
    """The affidavit tool function (and its reconcile hook) for one MCP tool."""
    name = tool_name(connection.name, mcp_tool)

    def call(ctx: ToolContext, **arguments: Any) -> Any:
        try:
            result = connection.call(mcp_tool, arguments, _meta(ctx))
        except McpConnectionError as exc:  # nothing was sent: safe to try again
            raise RetryableError(str(exc)) from exc
        except McpToolError as exc:
            if options.idempotent:  # the server deduplicates by the key
                raise RetryableError(str(exc)) from exc
            raise
        return _answer(result, name)

    reconcile: Callable[..., Any] | None = None
    if options.idempotent:

        def reconcile(ctx: ToolContext, **arguments: Any) -> Any:
            # The dead attempt's key: the server answers what it did for it (or acts now,
            # once, if it never received the call).
            return _answer(connection.call(mcp_tool, arguments, _meta(ctx)), name)

    elif options.reconcile is not None:
        lookup = options.reconcile

        def reconcile(ctx: ToolContext, **arguments: Any) -> Any:
            result = connection.call(lookup, {"idempotency_key": ctx.external_key}, _meta(ctx))
            found = _answer(result, tool_name(connection.name, lookup))
            if not isinstance(found, dict) or not isinstance(found.get("found"), bool):
                raise McpToolError(
                    f"reconcile tool {lookup!r} must answer "
                    '{"found": true, "result": ...} or {"found": false}'
                )
            return found.get("result") if found["found"] else None

    return name, call, reconcile


def load_servers(
    source: str | Path | Mapping[str, Any] | McpServersFile,
    *,
    registry: ToolRegistry | None = None,
) -> list[str]:
    """Connect to every server of an MCP servers file, list its tools, and register each as
    the affidavit tool ``mcp:SERVER/TOOL`` — in ``registry``, or (default) where
    ``@affidavit.tool`` registers, so that a ``--tools`` module calling this brings them.
    Returns the registered names, sorted. The connections stay open for the process.

    Raises:
        ConfigError: the file is not a valid servers file, or names options for a tool the
            server does not have.
        McpConnectionError: a server cannot be reached or listed.
    """
    from affidavit import ConfigError

    servers = source if isinstance(source, McpServersFile) else read_servers_file(source)
    registered: list[str] = []
    for server_name, config in servers.servers.items():
        connection = McpConnection(server_name, config)
        _open.append(connection)
        listed = connection.list_tools()
        unknown = sorted(set(config.tools) - set(listed))
        if unknown:
            raise ConfigError(
                f"MCP server {server_name!r} has no tool {', '.join(map(repr, unknown))}",
                hint=f"Its tools: {', '.join(listed) or '(none)'}.",
            )
        for mcp_tool in listed:
            options = config.options(mcp_tool)
            name, fn, reconcile = _make_tool(connection, mcp_tool, options)
            registered_tool = _register(name, fn, reconcile, options, registry)
            registered.append(name)
            _hook_up(connection, mcp_tool, options, registered_tool)
    return sorted(registered)


def _hook_up(connection: McpConnection, mcp_tool: str, options: ToolOptions, t: Tool) -> None:
    """Give the tool its ``@mcp_reconcile`` hook (now, or when it is registered), unless the
    servers file resolves it.

    Raises:
        ConfigError: the file resolves it and a hook is registered for it too.
    """
    alias = f"{connection.name}/{mcp_tool}"
    if options.kind == "pure":
        return
    if options.idempotent or options.reconcile is not None:
        mcp_reconcile.resolved_in_file(alias, "idempotent" if options.idempotent else "reconcile")
        return

    def wrap(hook: ReconcileHook) -> Callable[..., Any]:
        def reconcile(ctx: ToolContext, **arguments: Any) -> Any:
            call = McpCall(connection.name, mcp_tool, arguments, ctx.external_key, connection)
            return hook(ctx, call)

        return reconcile

    mcp_reconcile.attach(alias, t, wrap)


def _register(
    name: str,
    fn: Callable[..., Any],
    reconcile: Callable[..., Any] | None,
    options: ToolOptions,
    registry: ToolRegistry | None,
) -> Tool:
    if registry is not None:
        made = Tool(
            name,
            fn,
            options.kind,
            options.version,
            options.retry,
            (),
            options.in_flight,
            reconcile,
        )
        registry.add(made)
        return made
    if options.kind == "pure":
        return pure(name, version=options.version, retry=options.retry)(fn)
    registered = tool(
        name, version=options.version, retry=options.retry, in_flight=options.in_flight
    )(fn)
    if reconcile is not None:
        registered.reconcile(reconcile)
    return registered
