"""The MCP server bench_mcp calls: one tool that returns its argument (stdio)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

server: MCPServer = MCPServer("echo")


@server.tool()
def echo(i: int) -> dict[str, Any]:
    """Return the argument."""
    return {"i": i}


if __name__ == "__main__":
    server.run("stdio")
