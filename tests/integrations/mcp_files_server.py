"""A real MCP server for the tests, written with the MCP SDK's MCPServer (FastMCP): a file
writer whose every real write leaves a line in a side channel (``FILES_SIDE``), with the
idempotency key it received in ``_meta``.

    python mcp_files_server.py            # stdio
    python mcp_files_server.py --http PORT

``FILES_HANG=MARKER``: the first write (when MARKER does not exist yet) creates MARKER after
its effect and then hangs — the window in which a test kills the calling worker.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server: MCPServer = MCPServer("files")


def _side() -> Path:
    return Path(os.environ["FILES_SIDE"])


def _record(line: dict[str, Any]) -> None:
    fd = os.open(_side(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def _lines() -> list[dict[str, Any]]:
    try:
        text = _side().read_text()
    except FileNotFoundError:
        return []
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@server.tool()
def write_file(path: str, text: str, ctx: Context) -> dict[str, Any]:
    """Append a line to a file (a real side effect: a repeat shows as a second line)."""
    meta = ctx.request_context.meta or {}
    key = meta.get("affidavit/idempotency_key")
    with open(path, "a", encoding="utf-8") as f:
        f.write(text + "\n")
    result = {"path": path, "key": key, "bytes": len(text)}
    _record({"kind": "write", "key": key, "job": meta.get("affidavit/job_id"), "result": result})
    marker = os.environ.get("FILES_HANG")
    if marker and not Path(marker).exists():
        Path(marker).touch()
        parent, end = os.getppid(), time.monotonic() + 120
        while os.getppid() == parent and time.monotonic() < end:
            time.sleep(0.05)  # the test kills the worker (this server's parent) meanwhile
        os._exit(0)  # the caller is gone: nobody reads an answer
    return result


@server.tool()
def write_once(path: str, text: str, ctx: Context) -> dict[str, Any]:
    """write_file, deduplicated by the idempotency key in ``_meta``: a repeat with a key seen
    before answers the first call's result and writes nothing."""
    key = (ctx.request_context.meta or {}).get("affidavit/idempotency_key")
    for line in _lines():
        if line["kind"] == "write" and key is not None and line["key"] == key:
            return dict(line["result"])
    return write_file(path, text, ctx)


@server.tool()
def find_write(idempotency_key: str) -> dict[str, Any]:
    """Did a write with this key happen? Its result if so."""
    for line in _lines():
        if line["kind"] == "write" and line["key"] == idempotency_key:
            return {"found": True, "result": line["result"]}
    return {"found": False}


@server.tool()
def read_file(path: str) -> dict[str, Any]:
    """The file's lines (no side effect)."""
    return {"lines": Path(path).read_text(encoding="utf-8").splitlines()}


@server.tool()
def big(n: int) -> dict[str, Any]:
    """An answer of n characters."""
    return {"text": "x" * n}


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run("stdio")
