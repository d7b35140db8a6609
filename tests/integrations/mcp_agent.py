"""An agent whose tools come from an MCP server (``mcp:files/...``, registered by
:func:`affidavit.integrations.mcp.load_servers` where the agent runs)."""

from __future__ import annotations

from typing import Any

from affidavit import AgentContext, agent


@agent("mcp_archiver", version="1")
def archiver(ctx: AgentContext, path: str, text: str) -> dict[str, Any]:
    """Write a file through the MCP server, then read it back (a pure step)."""
    written = ctx.call("mcp:files/write_file", path=path, text=text)
    read = ctx.call("mcp:files/read_file", path=path)
    return {"written": written, "lines": read["lines"]}
