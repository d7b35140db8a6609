"""A ``--tools`` module for worker processes: the tools of npm's reference filesystem MCP server
(the servers file named by ``AFFIDAVIT_TEST_MCP_SERVERS``, alias ``fs``), and a Python reconcile
hook for its ``edit_file`` — registered after the tools, as a user's module may."""

from __future__ import annotations

import os
from typing import Any

import affidavit
from affidavit.integrations.mcp import McpCall, load_servers

load_servers(os.environ["AFFIDAVIT_TEST_MCP_SERVERS"])


@affidavit.mcp_reconcile("fs/edit_file")
def find_edit(ctx: affidavit.ToolContext, call: McpCall) -> Any:
    """Did the edit happen? Its new text is in the file (the server reads it for us)."""
    text = call.ask("read_text_file", {"path": call.arguments["path"]})["content"]
    wanted = call.arguments["edits"][0]["newText"]
    if wanted not in text:
        return None
    return {"content": [{"type": "text", "text": f"found on recovery: {wanted!r} is in the file"}]}
