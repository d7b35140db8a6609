"""Python ``reconcile`` hooks for MCP tools: ``@affidavit.mcp_reconcile("SERVER/TOOL")``.

A third-party MCP server has no tool that answers "did the call with this key happen?" and does
not deduplicate by the key it is sent. A hook written in Python, beside the servers file, says it
instead: called for an invocation caught in flight (the worker died during the call), with the
call's arguments and a handle on the same server, it looks at the world — usually through the
server's own read tools — and returns what the call answered (the effect is found: a catch-up
commit, the call is not repeated) or ``None`` (it did not happen: the invocation is closed as
lost and the step runs).

```python
import affidavit
from affidavit.integrations.mcp import McpCall, load_servers

load_servers("mcp-servers.yaml")          # fs: npx @modelcontextprotocol/server-filesystem


@affidavit.mcp_reconcile("fs/write_file")
def find_write(ctx: affidavit.ToolContext, call: McpCall) -> object | None:
    text = call.ask("read_text_file", {"path": call.arguments["path"]})["content"]
    found = text == call.arguments["content"]
    return {"content": [{"type": "text", "text": "found on recovery"}]} if found else None
```

The hooks are kept by the runtime (``affidavit.mcp_reconcile``: the decorator, and the table
:func:`~affidavit.integrations.mcp.load_servers` attaches them from); a hook may be registered
before or after ``load_servers`` registers the tool. A tool given ``reconcile:`` or
``idempotent: true`` in the servers file has its resolution there, and a hook for it is refused
(one answer per tool).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from affidavit import ToolContext, mcp_reconcile

__all__ = ["McpCall", "ReconcileHook", "mcp_reconcile"]


class _Server(Protocol):
    def ask(self, tool: str, arguments: Mapping[str, Any]) -> Any: ...


@dataclass(frozen=True)
class McpCall:
    """The call a hook is asked about: the server's alias, the tool, the call's arguments and
    the dead attempt's idempotency key (what was sent in ``_meta``); :meth:`ask` calls another
    tool of the same server and gives its answer as affidavit records one (the structured
    content, else ``{"content": [...]}``)."""

    server: str
    tool: str
    arguments: Mapping[str, Any]
    idempotency_key: str
    _connection: _Server

    def ask(self, tool: str, arguments: Mapping[str, Any]) -> Any:
        """Call ``tool`` of the same server (a read, to look for the effect).

        Raises:
            McpToolError: the server answered with an error, or the answer was lost.
            McpConnectionError: the server cannot be reached.
        """
        return self._connection.ask(tool, arguments)


ReconcileHook = Callable[[ToolContext, McpCall], Any]
