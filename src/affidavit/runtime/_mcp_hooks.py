"""``@affidavit.mcp_reconcile("SERVER/TOOL")``: the reconcile hooks of MCP tools, kept by name
until the tool ``mcp:SERVER/TOOL`` is registered (by the MCP integration's ``load_servers``,
before or after the hook), then attached to it as its ``reconcile``. What a hook receives and
returns: :mod:`affidavit.integrations.mcp.hooks` (docs/integrations.md)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from affidavit.core.errors import ConfigError
from affidavit.runtime._sdk import Tool

__all__ = ["McpReconcile", "mcp_reconcile"]

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}/[^\s/][^\s]{0,199}"
Hook = Callable[..., Any]
Wrap = Callable[[Hook], Callable[..., Any]]  # a hook → the tool's reconcile function


class McpReconcile:
    """The decorator (``mcp_reconcile(name)``) and the table behind it: the hooks by
    ``SERVER/TOOL``, the tools registered under those names, and the names the servers file
    resolves itself (``reconcile:``, ``idempotent: true``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: dict[str, Hook] = {}
        self._tools: dict[str, list[tuple[Tool, Wrap]]] = {}
        self._in_file: set[str] = set()

    def __call__(self, name: str) -> Callable[[Hook], Hook]:
        """Register ``fn(ctx, call) -> result | None`` as the reconcile hook of the MCP tool
        ``name`` (``SERVER/TOOL``: the servers file's alias and the server's tool name).

        Raises:
            ConfigError: ``name`` is not ``SERVER/TOOL``; the tool has a hook already, or its
                servers file gives it ``reconcile`` or ``idempotent``.
        """
        if not isinstance(name, str) or not re.fullmatch(_NAME, name):
            raise ConfigError(
                f"mcp_reconcile({name!r}): name the tool as SERVER/TOOL (e.g. 'fs/write_file')"
            )

        def register(fn: Hook) -> Hook:
            with self._lock:
                if name in self._in_file:
                    raise ConfigError(
                        f"MCP tool {name!r} is resolved by its servers file (reconcile or "
                        "idempotent)",
                        hint="Give a tool one resolution: the file's, or this hook.",
                    )
                if self._hooks.get(name, fn) is not fn:
                    raise ConfigError(f"MCP tool {name!r} has a reconcile hook already")
                self._hooks[name] = fn
                tools = list(self._tools.get(name, ()))
            for tool, wrap in tools:
                tool.reconcile_fn = wrap(fn)
            return fn

        return register

    def attach(self, name: str, tool: Tool, wrap: Wrap) -> None:
        """``tool`` (registered as ``mcp:NAME``, resolved by nothing else) takes the hook of
        ``NAME``: now, or when one is registered."""
        with self._lock:
            self._tools.setdefault(name, []).append((tool, wrap))
            hook = self._hooks.get(name)
        if hook is not None:
            tool.reconcile_fn = wrap(hook)

    def resolved_in_file(self, name: str, how: str) -> None:
        """The servers file resolves ``NAME`` (``how``: reconcile or idempotent).

        Raises:
            ConfigError: a hook is registered for it too.
        """
        with self._lock:
            if name in self._hooks:
                raise ConfigError(
                    f"MCP tool {name!r} has a reconcile hook and, in its servers file, {how}",
                    hint="Give a tool one resolution: the file's, or the hook.",
                )
            self._in_file.add(name)


mcp_reconcile = McpReconcile()
