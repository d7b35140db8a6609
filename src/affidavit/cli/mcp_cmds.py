"""``affidavit mcp``: serve affidavit's operations to agents as MCP tools (stdio or streamable
HTTP). The MCP SDK is imported only when the command runs (the ``mcp`` extra)."""

from __future__ import annotations

import os
import re
import socket
from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, command
from affidavit.cli.run_options import ToolsOption
from affidavit.core.config import database_url
from affidavit.core.errors import ConfigError
from affidavit.faces.limits import DEFAULT_MAX_BODY
from affidavit.faces.ratelimit import RateLimit

API_KEY_ENV = "AFFIDAVIT_API_KEY"
TRANSPORTS = ("stdio", "http")
PATH_PATTERN = r"/[A-Za-z0-9._~/-]{0,200}"


# Long because typer reads the command's options from its signature and its --help from its
# docstring (so this reason is not there); the body itself is under 50 lines.
def mcp(
    transport: Annotated[
        str, typer.Option(help="stdio (one client, this process's stdin/stdout) or http.")
    ] = "stdio",
    host: Annotated[str, typer.Option(help="http: interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="http: TCP port.")] = 8090,
    path: Annotated[str, typer.Option(help="http: the MCP endpoint's path.")] = "/mcp",
    rate_limit: Annotated[
        str,
        typer.Option(
            help="http: requests per key, REQUESTS/SECONDS (default 1200/60); 'off' for none."
        ),
    ] = "1200/60",
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="http: largest request body in bytes (413 beyond).")
    ] = DEFAULT_MAX_BODY,
    sessions_per_key: Annotated[
        int, typer.Option(min=1, help="http: open MCP sessions per key (429 beyond).")
    ] = 16,
    session_idle_timeout: Annotated[
        float,
        typer.Option(min=0.001, help="http: seconds an idle session lives before it is closed."),
    ] = 600.0,
    tools: ToolsOption = None,
    db: DbOption = None,
) -> None:
    """Serve affidavit's operations as MCP tools: list_jobs, get_job, submit_job, signal,
    approve, verify_job, export_pack, verify_pack, verify_claim, get_trust — each with an API
    key's role and namespace enforced as over HTTP.

    stdio: every call acts with the key in $AFFIDAVIT_API_KEY (required). http: every request
    brings its own key (`Authorization: Bearer <key>`, 401 without: checked before the body is
    read); the endpoint is http://HOST:PORT/mcp. Each key is rate limited (429), a body above
    --max-body-bytes refused (413), and a key holds at most --sessions-per-key sessions (one
    more is refused with 429 until one closes or idles out after --session-idle-timeout).

    With --tools, submit_job checks plans against those tools and finds the agents they
    register; without, workers check plans when they run them, and agents cannot be submitted.

    Exit codes: 0 stopped; 3 a bad option (a --path that is no URL path, a --host or --port
    that cannot be listened on), a missing key, the mcp extra not installed, or a store error.
    """
    with command(False):
        _check(transport, path)
        limit = None if rate_limit.strip().lower() == "off" else RateLimit.parse(rate_limit)
        api_key = os.environ.get(API_KEY_ENV) or None
        if transport == "stdio" and api_key is None:
            raise ConfigError(
                f"${API_KEY_ENV} is not set",
                hint="Over stdio every call acts with that key: create one with `affidavit "
                "apikeys create --agent NAME --role agent`.",
            )
        try:
            from affidavit.mcp.http_gate import SessionLimits, gated_http_app
            from affidavit.mcp.server import build_server
        except ImportError as exc:
            raise ConfigError(
                f"the MCP SDK is not installed: {exc}",
                hint="pip install 'affidavit[mcp]'",
            ) from exc
        from affidavit.runtime import load_tools, registry
        from affidavit.store import open_store

        for spec in tools or []:
            load_tools(spec)
        sessions = SessionLimits(sessions_per_key, session_idle_timeout)
        listening = _listen(host, port) if transport == "http" else None
        store = open_store(database_url(db))
    try:
        server = build_server(
            store,
            api_key=api_key if transport == "stdio" else None,
            tools=registry if tools else None,
        )
        if transport == "stdio":
            server.run("stdio")
        else:
            import uvicorn

            app = gated_http_app(
                server,
                store,
                path=path,
                host=host,
                rate_limit=limit,
                max_body=max_body_bytes,
                sessions=sessions,
            )
            assert listening is not None
            output.err.print(
                f"affidavit MCP server on http://{host}:{port}{path} ({store.backend})"
            )
            config = uvicorn.Config(app, log_level="warning")
            uvicorn.Server(config).run(sockets=[listening])
    finally:
        store.close()
        if listening is not None:
            listening.close()


def _check(transport: str, path: str) -> None:
    """Raises: ConfigError: an unknown transport, or a ``--path`` that is no URL path."""
    if transport not in TRANSPORTS:
        raise ConfigError(
            f"unknown transport {transport!r}", hint=f"Use one of: {', '.join(TRANSPORTS)}."
        )
    if not re.fullmatch(PATH_PATTERN, path):
        raise ConfigError(
            f"--path {path!r} is not an endpoint path",
            hint="Give an absolute URL path such as /mcp: '/' then letters, digits and '-._~/'.",
        )


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (before the server starts: a bad host or a port in
    use is a clear error, exit 3).

    Raises:
        ConfigError: the address cannot be bound.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"--host {host!r} is no address to listen on: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="Choose another --port (or stop what holds it) or another --host.",
        ) from exc
    return sock


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)
