"""MCP (Model Context Protocol) client integration, the ``affidavit[mcp]`` extra:
:func:`load_servers` gives an MCP server's tools as affidavit tools (``mcp:SERVER/TOOL``), every
``tools/call`` one step through the ledger (client.py, the servers file in config.py), a call
caught in flight resolved by the servers file or by a Python hook, ``@mcp_reconcile`` (hooks.py).

The other direction — ``affidavit mcp``, affidavit's operations served to agents as MCP tools —
is a face beside the CLI and the HTTP API: :mod:`affidavit.mcp`.
"""

from affidavit.integrations.mcp.client import (
    META_IDEMPOTENCY_KEY,
    META_JOB_ID,
    META_STEP_ID,
    McpConnection,
    McpConnectionError,
    McpToolError,
    load_servers,
    tool_name,
)
from affidavit.integrations.mcp.config import (
    McpServersFile,
    ServerConfig,
    ToolOptions,
    read_servers_file,
)
from affidavit.integrations.mcp.hooks import McpCall, ReconcileHook, mcp_reconcile

__all__ = [
    "META_IDEMPOTENCY_KEY",
    "META_JOB_ID",
    "META_STEP_ID",
    "McpCall",
    "McpConnection",
    "McpConnectionError",
    "McpServersFile",
    "McpToolError",
    "ReconcileHook",
    "ServerConfig",
    "ToolOptions",
    "load_servers",
    "mcp_reconcile",
    "read_servers_file",
    "tool_name",
]
