"""The MCP servers file: which servers a process connects to, and how each tool's calls are
recorded (docs/integrations.md).

```yaml
servers:
  files:                                  # tools are named mcp:files/TOOL
    command: [python, files_server.py]    # stdio: the server is started as a subprocess
    env: {FILES_ROOT: /srv/files}         # added to a minimal inherited environment
    timeout_seconds: 60                   # one tools/call's limit (default 300)
    tools:
      write_file: {reconcile: find_write}   # in flight? ask the server's find_write
      read_file: {kind: pure}                # no side effect: recorded, not ledgered
  crm:
    url: http://127.0.0.1:9000/mcp        # streamable HTTP
    headers: {Authorization: Bearer ...}
    tools:
      create_ticket: {idempotent: true}      # the server deduplicates by the _meta key
```
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from affidavit import ConfigError

__all__ = ["McpServersFile", "ServerConfig", "ToolOptions", "read_servers_file"]

MAX_FILE_BYTES = 1024 * 1024
_SERVER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z"


class ToolOptions(BaseModel):
    """How calls of one MCP tool are recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tool", "pure"] = Field(
        "tool",
        description="tool: may change the world (a ledgered tool step); pure: read-only "
        "(recorded once, never re-asked on replay).",
    )
    reconcile: str | None = Field(
        None,
        description="A tool of the same server that answers, for the key of an invocation "
        'caught in flight, {"found": true, "result": ...} or {"found": false}.',
    )
    idempotent: bool = Field(
        False,
        description="The server deduplicates calls by the idempotency key in _meta: an "
        "invocation caught in flight is resolved by repeating it with the same key.",
    )
    in_flight: Literal["park", "fail"] | None = Field(
        None, description="The policy when neither reconcile nor idempotent resolves it."
    )
    retry: int | None = Field(None, ge=1, le=100, description="Max attempts.")
    version: str = "1"

    @model_validator(mode="after")
    def _one_resolution(self) -> ToolOptions:
        if self.reconcile is not None and self.idempotent:
            raise ValueError("give reconcile or idempotent, not both")
        if self.kind == "pure" and (self.reconcile or self.idempotent or self.in_flight):
            raise ValueError("a pure tool has no in-flight resolution (it has no side effect)")
        return self


class ServerConfig(BaseModel):
    """One MCP server: a command (stdio) or a URL (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str] | None = Field(None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = Field(None, pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float = Field(300.0, gt=0, le=86_400)
    tools: dict[str, ToolOptions] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        if self.url is None and self.headers:
            raise ValueError("headers are for a url server")
        if self.command is None and (self.env or self.cwd):
            raise ValueError("env and cwd are for a command server")
        return self

    def options(self, tool: str) -> ToolOptions:
        return self.tools.get(tool) or ToolOptions.model_validate({})


class McpServersFile(BaseModel):
    """The whole file: server name → server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: dict[str, ServerConfig]

    @model_validator(mode="after")
    def _names(self) -> McpServersFile:
        for name in self.servers:
            if not re.match(_SERVER_NAME, name):
                raise ValueError(
                    f"server name {name!r}: 1–64 letters, digits, '_', '.', '-' (no '/' or ':')"
                )
        return self


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} given twice")
        out[key] = value
    return out


def read_servers_file(source: str | Path | Mapping[str, Any]) -> McpServersFile:
    """Read and validate an MCP servers file (``.json``, or ``.yaml``/``.yml``), or a mapping
    of the same shape.

    Raises:
        ConfigError: the file cannot be read, is too large (1 MiB), or is not a valid servers
            file — naming what is wrong.
    """
    if isinstance(source, Mapping):
        data: Any = source
        where = "MCP servers configuration"
    else:
        path = Path(source)
        where = f"MCP servers file {str(path)!r}"
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {where}: {exc.strerror or exc}") from exc
        if len(raw) > MAX_FILE_BYTES:
            raise ConfigError(f"{where} is larger than {MAX_FILE_BYTES} bytes")
        try:
            if path.suffix in (".yaml", ".yml"):
                data = yaml.safe_load(raw)
            else:
                data = json.loads(raw, object_pairs_hook=_no_duplicates)
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigError(
                f"{where} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}"
            ) from exc
    try:
        return McpServersFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(
            f"{where}: {loc}: {first['msg']}",
            hint="See docs/integrations.md for the servers file format.",
        ) from None
