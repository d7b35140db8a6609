"""``affidavit mcp``: serve affidavit's operations to agents as MCP tools (stdio or streamable
HTTP). The MCP SDK is imported only when the command runs (the ``mcp`` extra)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, command
from affidavit.core.config import database_url
from affidavit.core.errors import ConfigError

API_KEY_ENV = "AFFIDAVIT_API_KEY"
TRANSPORTS = ("stdio", "http")


def mcp(
    transport: Annotated[
        str, typer.Option(help="stdio (one client, this process's stdin/stdout) or http.")
    ] = "stdio",
    host: Annotated[str, typer.Option(help="http: interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="http: TCP port.")] = 8090,
    path: Annotated[str, typer.Option(help="http: the MCP endpoint's path.")] = "/mcp",
    db: DbOption = None,
) -> None:
    """Serve affidavit's operations as MCP tools: verify_job, export_pack, verify_pack,
    verify_claim, get_trust — each with an API key's role and namespace enforced as over HTTP.

    stdio: every call acts with the key in $AFFIDAVIT_API_KEY (required). http: every request
    brings its own key (`Authorization: Bearer <key>`); the endpoint is http://HOST:PORT/mcp.

    Exit codes: 0 stopped; 3 a bad option, a missing key, the mcp extra not installed, or a
    store error.
    """
    with command(False):
        if transport not in TRANSPORTS:
            raise ConfigError(
                f"unknown transport {transport!r}", hint=f"Use one of: {', '.join(TRANSPORTS)}."
            )
        api_key = os.environ.get(API_KEY_ENV) or None
        if transport == "stdio" and api_key is None:
            raise ConfigError(
                f"${API_KEY_ENV} is not set",
                hint="Over stdio every call acts with that key: create one with `affidavit "
                "apikeys create --agent NAME --role agent`.",
            )
        try:
            from affidavit.integrations.mcp.server import build_server
        except ImportError as exc:
            raise ConfigError(
                f"the MCP SDK is not installed: {exc}",
                hint="pip install 'affidavit[mcp]'",
            ) from exc
        from affidavit.store import open_store

        store = open_store(database_url(db))
    try:
        server = build_server(store, api_key=api_key if transport == "stdio" else None)
        if transport == "stdio":
            server.run("stdio")
        else:
            import uvicorn

            app = server.streamable_http_app(streamable_http_path=path, host=host)
            output.err.print(
                f"affidavit MCP server on http://{host}:{port}{path} ({store.backend})"
            )
            uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        store.close()


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)
