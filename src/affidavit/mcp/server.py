"""``affidavit mcp``: affidavit's operations served to agents as MCP tools.

Tools (docs/integrations.md has the table): ``verify_job``, ``export_pack``, ``verify_pack``,
``verify_claim``, ``get_trust`` (:mod:`~affidavit.mcp._verify_tools`); ``list_jobs``,
``get_job``, ``submit_job``, ``signal``, ``approve`` (:mod:`~affidavit.mcp._job_tools`). Each
has an ``outputSchema`` and its read-only / destructive / idempotent hints.

Each call authenticates an affidavit API key and enforces its role and namespace exactly as the
HTTP API does (docs/api.md): over streamable HTTP the key comes in each request's
``Authorization: Bearer <key>`` header; over stdio the server is started with one key
(``AFFIDAVIT_API_KEY``), checked again on every call (a revoked key stops working at once).

A refused or failed call — arguments that do not fit the tool's ``inputSchema`` too — is an MCP
tool error (``isError``) whose text is ``Error executing tool NAME: `` followed by the JSON
document ``{"error": {"code", "message", "hint"}}`` of the CLI and the API; a refused call
writes nothing.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from affidavit import __version__
from affidavit.claims import SandboxConfig
from affidavit.faces.limits import ClaimLimits, ClaimSlots
from affidavit.mcp._calls import Calls
from affidavit.mcp._job_tools import job_tools
from affidavit.mcp._verify_tools import (
    MAX_ARCHIVE_BYTES,
    MAX_EXTRACTED_BYTES,
    MAX_MEMBERS,
    verify_tools,
)
from affidavit.packs import PackArchiveError
from affidavit.runtime import ToolRegistry
from affidavit.store import Store

__all__ = [
    "MAX_ARCHIVE_BYTES",
    "MAX_EXTRACTED_BYTES",
    "MAX_MEMBERS",
    "ROLES",
    "PackArchiveError",
    "build_server",
]

INSTRUCTIONS = (
    "affidavit: list, read, submit and decide durable AI-agent jobs; verify them and their "
    "proof packs; verify an agent's claim by running its check; read an agent's trust score."
)
# the role each tool needs (docs/integrations.md's table; a test holds the two together)
ROLES = {
    "verify_job": "observer",
    "export_pack": "observer",
    "verify_pack": "observer",
    "verify_claim": "admin",
    "get_trust": "observer",
    "list_jobs": "observer",
    "get_job": "observer",
    "submit_job": "agent",
    "signal": "agent",
    "approve": "approver",
}


def build_server(
    store: Store,
    *,
    api_key: str | None = None,
    name: str = "affidavit",
    claims_sandbox: SandboxConfig | None = None,
    claim_limits: ClaimLimits | None = None,
    tools: ToolRegistry | None = None,
) -> MCPServer:
    """An MCP server (the SDK's ``MCPServer``, its ``serverInfo.version`` affidavit's) whose
    tools call affidavit's services on ``store``. ``api_key``: the key every call on a
    transport without headers (stdio) acts with; over HTTP each request's ``Authorization``
    header is used instead.

    ``claims_sandbox``: how claim commands run (``None``: the default, bubblewrap), as
    ``create_app``'s; ``claim_limits``: how many claims run at once (in all and per verifying
    agent) and the longest timeout one may ask for, as the HTTP API's. ``tools``: the registry
    ``submit_job`` checks plans against and finds agents in (``None``: the workers check plans,
    agents are looked up in the process's registry). Run it with
    ``server.run("stdio")`` or serve ``server.streamable_http_app()``.
    """
    calls = Calls(store, api_key)
    slots = ClaimSlots(claim_limits or ClaimLimits())
    served = verify_tools(store, calls, slots, claims_sandbox) + job_tools(store, calls, tools)
    assert {t.name for t in served} == set(ROLES)
    return MCPServer(name, instructions=INSTRUCTIONS, version=__version__, tools=served)
