"""What every ``affidavit mcp`` tool shares: the caller's key and role, blocking work off the
event loop, and errors in the ``{"error": {"code", "message", "hint"}}`` shape — an argument
that does not fit the tool's ``inputSchema`` too."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import ValidationError as ArgumentsError

from affidavit.core.errors import AffidavitError, AgentNotFound, JobNotFound, ValidationError
from affidavit.faces.auth import Caller, Forbidden, Unauthorized, authenticate
from affidavit.store import JobRecord, Store

T = TypeVar("T")
MAX_ARGUMENT_ERRORS = 5  # listed in one message


def tool_error(exc: AffidavitError) -> ToolError:
    """``exc`` as the tool error a client reads: its JSON document."""
    return ToolError(json.dumps({"error": exc.to_dict()}, ensure_ascii=False))


def _arguments_message(exc: ArgumentsError) -> str:
    parts = []
    for error in exc.errors()[:MAX_ARGUMENT_ERRORS]:
        where = ".".join(str(p) for p in error["loc"]) or "(arguments)"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - MAX_ARGUMENT_ERRORS
    return "invalid arguments: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


class CheckedTool(Tool):
    """An SDK tool whose argument errors come back as ``invalid_input`` documents (the SDK's
    own text is pydantic's report)."""

    async def run(
        self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False
    ) -> Any:
        try:
            return await super().run(arguments, context, convert_result)
        except ToolError as exc:
            # the SDK's argument check (a crash, or an output that fails its schema, is an
            # UnexpectedToolError; the tools' own refusals carry an AffidavitError)
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ArgumentsError):
                raise
            invalid = ValidationError(
                _arguments_message(cause),
                hint=f"See the inputSchema of {self.name} (tools/list).",
            )
            raise ToolError(f"Error executing tool {self.name}: {tool_error(invalid)}") from exc


def make_tool(
    fn: Callable[..., Any],
    name: str,
    description: str,
    *,
    read_only: bool,
    destructive: bool = False,
    idempotent: bool,
) -> Tool:
    """``fn`` as a tool with its hints (the SDK derives the input and output schemas from its
    signature and return annotation)."""
    return CheckedTool.from_function(
        fn,
        name=name,
        description=description,
        annotations=ToolAnnotations(
            read_only_hint=read_only,
            destructive_hint=destructive,
            idempotent_hint=idempotent,
            open_world_hint=False,
        ),
        structured_output=True,
    )


class Calls:
    """The server's state: one store, and the key a stdio server acts with."""

    def __init__(self, store: Store, api_key: str | None) -> None:
        self.store = store
        self.api_key = api_key

    def caller(self, ctx: Context | None, role: str) -> Caller:
        """The authenticated caller of this request, holding ``role`` or above.

        Raises:
            Unauthorized: no key, or an unknown, wrong or revoked one.
            Forbidden: the key's role is below ``role``.
        """
        headers: Mapping[str, str] | None = None
        if ctx is not None:
            try:
                headers = ctx.headers
            except ValueError:  # no request context (called outside a request)
                headers = None
        if headers is not None:  # HTTP: every request brings its own key
            caller = authenticate(self.store, headers.get("authorization"))
        else:
            if self.api_key is None:
                raise Unauthorized(
                    "missing API key",
                    hint="Start `affidavit mcp` with AFFIDAVIT_API_KEY set to a key from "
                    "`affidavit apikeys create`.",
                )
            caller = authenticate(self.store, f"Bearer {self.api_key}")
        if not caller.has(role):
            raise Forbidden(f"role {caller.role!r} may not do this; it needs {role!r} or above")
        return caller

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (blocking: a database read, a claim's command) off the event loop; an
        affidavit error becomes the tool error the client reads."""
        try:
            return await anyio.to_thread.run_sync(fn)
        except AffidavitError as exc:
            raise tool_error(exc) from exc

    def visible_agent(self, service: Any, caller: Caller, agent_id: str) -> Any:
        agent = service.get_agent(agent_id)
        if not caller.sees(agent.namespace):
            raise AgentNotFound(agent_id)  # as over HTTP: another namespace's agent is unknown
        return agent

    def visible_job(self, caller: Caller, job_id: str) -> JobRecord:
        """The job, if the caller may see it (another namespace's is not found, as over HTTP).

        Raises:
            JobNotFound: no such job, or not the caller's namespace.
        """
        job = self.store.get_job(job_id)
        if not caller.sees(job.namespace):
            raise JobNotFound(job_id)
        return job
