"""``affidavit mcp``: affidavit's own operations served to agents as MCP tools.

Tools: ``verify_job``, ``export_pack``, ``verify_pack``, ``verify_claim``, ``get_trust``. Each
call authenticates an affidavit API key and enforces its role and namespace exactly as the
HTTP API does (docs/api.md): over streamable HTTP the key comes in each request's
``Authorization: Bearer <key>`` header; over stdio the server is started with one key
(``AFFIDAVIT_API_KEY``), checked again on every call (a revoked key stops working at once).

A refused or failed call is an MCP tool error (``isError``) whose text is
``Error executing tool NAME: `` followed by the JSON document ``{"error": {"code", "message",
"hint"}}`` of the CLI and the API; a refused call writes nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from affidavit.claims import ClaimService, SandboxConfig
from affidavit.claims.model import Agent, ClaimType
from affidavit.core.errors import AffidavitError, AgentNotFound, JobNotFound, ValidationError
from affidavit.faces.auth import Caller, Forbidden, Unauthorized, authenticate
from affidavit.faces.limits import ClaimLimits, ClaimSlots
from affidavit.packs import export_archive, verify_pack
from affidavit.store import Store
from affidavit.verify import verify_job

__all__ = ["MAX_ARCHIVE_BYTES", "MAX_EXTRACTED_BYTES", "PackArchiveError", "build_server"]

MAX_ARCHIVE_BYTES = 64 * 1024 * 1024  # a pack archive sent or returned, compressed
MAX_EXTRACTED_BYTES = 512 * 1024 * 1024  # what an archive sent to verify_pack may unpack to
MAX_MEMBERS = 100_000
INSTRUCTIONS = (
    "affidavit: verify durable AI-agent jobs and their proof packs, verify an agent's claim by "
    "running its check, and read an agent's trust score."
)

T = TypeVar("T")


class PackArchiveError(AffidavitError):
    """What was sent as a pack archive is not one this server unpacks."""

    code = "invalid_pack_archive"
    default_hint = (
        "Send the base64 of the .tar.gz that `export_pack` or GET /api/jobs/{id}/pack gives "
        "(one directory; regular files only)."
    )


def _error(exc: AffidavitError) -> ToolError:
    return ToolError(json.dumps({"error": exc.to_dict()}, ensure_ascii=False))


class _Calls:
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
            raise _error(exc) from exc

    def visible_agent(self, service: ClaimService, caller: Caller, agent_id: str) -> Agent:
        agent = service.get_agent(agent_id)
        if not caller.sees(agent.namespace):
            raise AgentNotFound(agent_id)  # as over HTTP: another namespace's agent is unknown
        return agent

    def check_job(self, caller: Caller, job_id: str) -> None:
        if not caller.sees(self.store.get_job(job_id).namespace):
            raise JobNotFound(job_id)


def _unpack(archive: bytes, into: Path) -> Path:
    """Extract a pack archive (one top directory) safely: bounded size and member count,
    regular files and directories only, nothing outside ``into``.

    Raises:
        PackArchiveError: anything else.
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            members: list[tarfile.TarInfo] = []
            total = 0
            for member in tar:
                if len(members) >= MAX_MEMBERS:
                    raise PackArchiveError(f"pack archive holds more than {MAX_MEMBERS} entries")
                if not (member.isfile() or member.isdir()):
                    raise PackArchiveError(
                        f"pack archive entry {member.name!r} is neither a file nor a directory"
                    )
                total += member.size
                if total > MAX_EXTRACTED_BYTES:
                    raise PackArchiveError(
                        f"pack archive unpacks to more than {MAX_EXTRACTED_BYTES} bytes"
                    )
                members.append(member)
            tops = {Path(m.name).parts[0] for m in members if Path(m.name).parts}
            if len(tops) != 1:
                raise PackArchiveError(
                    f"a pack archive holds one directory, not {len(tops)} top-level entries"
                )
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PackArchiveError(f"not a readable pack archive: {exc}") from exc
    top = into / tops.pop()
    if not top.is_dir():
        raise PackArchiveError("a pack archive holds one directory, not a file")
    return top


def _decode(archive_base64: str) -> bytes:
    if len(archive_base64) > (MAX_ARCHIVE_BYTES * 4) // 3 + 4:
        raise PackArchiveError(f"pack archive is larger than {MAX_ARCHIVE_BYTES} bytes")
    try:
        return base64.b64decode(archive_base64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PackArchiveError(f"archive_base64 is not base64: {exc}") from exc


def build_server(
    store: Store,
    *,
    api_key: str | None = None,
    name: str = "affidavit",
    claims_sandbox: SandboxConfig | None = None,
    claim_limits: ClaimLimits | None = None,
) -> MCPServer:
    """An MCP server (the SDK's ``MCPServer``) whose tools call affidavit's services on
    ``store``. ``api_key``: the key every call on a transport without headers (stdio) acts
    with; over HTTP each request's ``Authorization`` header is used instead.

    ``claims_sandbox``: how claim commands run (``None``: the default, bubblewrap), as
    ``create_app``'s; ``claim_limits``: how many claims run at once (in all and per verifying
    agent) and the longest timeout one may ask for, as the HTTP API's. Run it with
    ``server.run("stdio")`` or serve ``server.streamable_http_app()``.
    """
    calls = _Calls(store, api_key)
    slots = ClaimSlots(claim_limits or ClaimLimits())
    server: MCPServer = MCPServer(name, instructions=INSTRUCTIONS)

    _add_verify_job(server, store, calls)
    _add_export_pack(server, store, calls)
    _add_verify_pack(server, store, calls)
    _add_verify_claim(server, store, calls, slots, claims_sandbox)
    _add_get_trust(server, store, calls)
    return server


def _add_verify_job(server: MCPServer, store: Store, calls: _Calls) -> None:
    """Register the ``verify_job`` tool on ``server``."""

    @server.tool(
        name="verify_job",
        description="Verification Mode for one job (read-only): execution hash, event chain "
        "root, ledger and replay proofs, stored chain, seal. `ok` is the verdict. Role: "
        "observer.",
    )
    async def verify_job_tool(
        job_id: Annotated[str, Field(min_length=1, max_length=200)],
        ctx: Context,
        trusted_keys: Annotated[
            list[str] | None,
            Field(
                description="Pin the seal's keys: base64 Ed25519 public keys or key ids.",
                max_length=32,
            ),
        ] = None,
    ) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            caller = calls.caller(ctx, "observer")
            calls.check_job(caller, job_id)
            return verify_job(store, job_id, trusted_keys=trusted_keys or None).to_dict()

        return await calls.run(work)


def _add_export_pack(server: MCPServer, store: Store, calls: _Calls) -> None:
    """Register the ``export_pack`` tool on ``server``."""

    @server.tool(
        name="export_pack",
        description="The finished job as a signed RCE v0.1 proof pack: a base64 .tar.gz "
        "(verify it offline with `affidavit pack verify` or the verify_pack tool). Role: "
        "observer.",
    )
    async def export_pack_tool(
        job_id: Annotated[str, Field(min_length=1, max_length=200)], ctx: Context
    ) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            caller = calls.caller(ctx, "observer")
            calls.check_job(caller, job_id)
            data, result = export_archive(store, job_id)
            if len(data) > MAX_ARCHIVE_BYTES:
                raise ValidationError(
                    f"the pack of job {job_id} is {len(data)} bytes, more than an MCP answer "
                    f"carries here ({MAX_ARCHIVE_BYTES})",
                    hint="Download it with GET /api/jobs/{id}/pack or `affidavit pack export`.",
                )
            return {
                "job_id": job_id,
                "filename": f"pack-{job_id}.tar.gz",
                "archive_sha256": hashlib.sha256(data).hexdigest(),
                "archive_bytes": len(data),
                "pack_root_sha256": result.pack_root_sha256,
                "assay_diverging_steps": list(result.assay_diverging_steps),
                "archive_base64": base64.b64encode(data).decode("ascii"),
            }

        return await calls.run(work)


def _add_verify_pack(server: MCPServer, store: Store, calls: _Calls) -> None:
    """Register the ``verify_pack`` tool on ``server``."""

    @server.tool(
        name="verify_pack",
        description="Verify a proof pack sent as a base64 .tar.gz (phases 1–5 of the RCE "
        "verification); verdict MATCH, DIVERGE or INTEGRITY_FAIL. Role: observer.",
    )
    async def verify_pack_tool(
        archive_base64: Annotated[str, Field(min_length=1)],
        ctx: Context,
        trusted_keys: Annotated[
            list[str] | None,
            Field(description="Pin the signers: base64 Ed25519 public keys.", max_length=32),
        ] = None,
    ) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            calls.caller(ctx, "observer")
            archive = _decode(archive_base64)
            with tempfile.TemporaryDirectory(prefix="affidavit-mcp-pack-") as tmp:
                verdict = verify_pack(_unpack(archive, Path(tmp)), trusted_keys=trusted_keys)
            return {
                "verdict": verdict.verdict,
                "ok": verdict.ok,
                "exit_code": verdict.exit_code,
                "phase": verdict.phase,
                "errors": verdict.errors,
                "receipt": verdict.receipt,
            }

        return await calls.run(work)


def _add_verify_claim(
    server: MCPServer,
    store: Store,
    calls: _Calls,
    slots: ClaimSlots,
    claims_sandbox: SandboxConfig | None,
) -> None:
    """Register the ``verify_claim`` tool on ``server``."""

    @server.tool(
        name="verify_claim",
        description="Judge another agent's claim by running its check (allow-listed command, "
        "no shell, sandboxed); the caller's agent is the verifier, the evidence is recorded "
        "and the claimant's trust moves on it. The caller supplies what the claimant claims, "
        "so this is for admin keys only (agents record their own claims over HTTP, "
        "POST /api/claims, and verify each other's by id).",
    )
    async def verify_claim_tool(
        agent_id: Annotated[str, Field(min_length=1, max_length=128, description="The claimant.")],
        claim_type: ClaimType,
        claim: Annotated[
            dict[str, Any],
            Field(
                description="return_code, output_contains, metrics (+ tolerance, parser), "
                "exact_match, pattern_id."
            ),
        ],
        command: Annotated[str, Field(min_length=1, description="The check to run.")],
        ctx: Context,
        timeout_s: Annotated[float | None, Field(gt=0, le=600)] = None,
    ) -> dict[str, Any]:
        caller = await calls.run(lambda: calls.caller(ctx, "admin"))
        service = ClaimService(store, sandbox=claims_sandbox)
        cap = slots.limits.max_timeout_s
        if timeout_s is not None and timeout_s > cap:
            raise _error(
                ValidationError(
                    f"timeout_s {timeout_s:g} is above this server's limit of {cap:g} seconds",
                    hint="Ask for a shorter timeout.",
                )
            )
        timeout = min(timeout_s if timeout_s is not None else service.sandbox.timeout_s, cap)

        def work() -> dict[str, Any]:
            calls.visible_agent(service, caller, agent_id)
            result = service.verify_claim(
                agent_id, claim_type, claim, command, caller.agent_id, timeout_s=timeout
            )
            return result.to_dict()

        try:  # at most the HTTP API's number of claims at once, in all and per verifier
            return await slots.run(caller.agent_id, work)
        except AffidavitError as exc:
            raise _error(exc) from exc


def _add_get_trust(server: MCPServer, store: Store, calls: _Calls) -> None:
    """Register the ``get_trust`` tool on ``server``."""

    @server.tool(
        name="get_trust",
        description="An agent's trust score, whether it still requires verification, and its "
        "counters. Role: observer, in the agent's namespace (admins: any).",
    )
    async def get_trust_tool(
        agent_id: Annotated[str, Field(min_length=1, max_length=128)], ctx: Context
    ) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            caller = calls.caller(ctx, "observer")
            service = ClaimService(store)
            return service.agent_dict(calls.visible_agent(service, caller, agent_id))

        return await calls.run(work)
