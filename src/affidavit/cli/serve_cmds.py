"""``affidavit serve`` (the HTTP API) and ``affidavit apikeys create|list|revoke``."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from affidavit.claims.bwrap import OPT_OUT_FLAG, PACKAGE, find_bwrap
from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.cli.log_cmds import background_sequencer
from affidavit.cli.run_options import ToolsOption
from affidavit.core.config import database_url
from affidavit.core.errors import ConfigError
from affidavit.faces.auth import ROLES, create_api_key, revoke_api_key
from affidavit.faces.limits import (
    DEFAULT_CLAIM_CONCURRENCY,
    DEFAULT_CLAIM_MAX_TIMEOUT_S,
    DEFAULT_CLAIM_PER_AGENT,
    DEFAULT_MAX_BODY,
    ClaimLimits,
)

if TYPE_CHECKING:
    from affidavit.claims.sandbox import SandboxConfig
    from affidavit.store import Store

# What a server started without --tools tells its operator: the server never runs a job's code
# (workers do), and it can only accept an agent job for an agent it knows.
NO_TOOLS_NOTE = (
    "no --tools: plans are checked by the workers that run them, and an agent job "
    '(POST /api/jobs {"agent": NAME, "input": {...}}) is refused for an agent this server does '
    "not know — start it with --tools MODULE (the module that defines @affidavit.agent NAME). "
    "Agent code runs in the workers, never here: start them with the same --tools "
    "(affidavit worker --tools MODULE)."
)

apikeys_app = typer.Typer(help="API keys of the HTTP API.", no_args_is_help=True)


@apikeys_app.command("create")
def apikeys_create(
    agent: Annotated[str, typer.Option("--agent", help="The agent the key acts as.")],
    role: Annotated[str, typer.Option("--role", help=f"One of: {', '.join(ROLES)}.")],
    namespace: Annotated[
        str, typer.Option("--namespace", help="The namespace the key sees (admins: all).")
    ] = "default",
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create an API key and print it — once: only its hash is stored.

    Exit codes: 0 created; 3 an unknown role, an invalid namespace or agent id, or a store
    error (nothing is written).
    """
    with command(as_json), opened(db) as store:
        row, key = create_api_key(store, agent_id=agent, role=role, namespace=namespace)
    if as_json:
        output.emit_json({"key_id": row.key_id, "key": key, **row.to_dict()})
        return
    output.err.print(
        f"key {row.key_id} for agent {row.agent_id} ({row.role}, namespace {row.namespace}); "
        "store it now, it is not shown again:"
    )
    output.out.print(key)


@apikeys_app.command("list")
def apikeys_list(db: DbOption = None, as_json: JsonOption = False) -> None:
    """List API keys (never the keys themselves).

    Exit codes: 0 listed; 3 store error.
    """
    with command(as_json), opened(db) as store:
        rows = store.list_api_keys()
    if as_json:
        output.emit_json([r.to_dict() for r in rows])
        return
    table = Table("key id", "agent", "role", "namespace", "created", "revoked")
    for r in rows:
        table.add_row(r.key_id, r.agent_id, r.role, r.namespace, r.created_at, r.revoked_at or "")
    output.out.print(table)


@apikeys_app.command("revoke")
def apikeys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (from `apikeys list`).")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke an API key: every later request with it gets 401. Revoking twice is harmless.

    Exit codes: 0 revoked; 2 no such key; 3 store error.
    """
    with command(as_json), opened(db) as store:
        row = revoke_api_key(store, key_id)
    if as_json:
        output.emit_json(row.to_dict())
    else:
        output.out.print(f"key {row.key_id} revoked at {row.revoked_at}")


def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8080,
    tools: ToolsOption = None,
    rate_limit: Annotated[
        str,
        typer.Option(help="Requests per key: REQUESTS/SECONDS (default 1200/60); 'off' for none."),
    ] = "1200/60",
    insecure_claims_without_sandbox: Annotated[
        bool,
        typer.Option(
            OPT_OUT_FLAG,
            help="DANGEROUS: run claim commands without the bubblewrap sandbox, with the "
            "server's own user and files in reach. Only when every claim's command is trusted.",
        ),
    ] = False,
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="Largest request body in bytes (413 beyond).")
    ] = DEFAULT_MAX_BODY,
    claim_concurrency: Annotated[
        int, typer.Option(min=1, help="Claims running at once, in all (503 beyond).")
    ] = DEFAULT_CLAIM_CONCURRENCY,
    claim_concurrency_per_agent: Annotated[
        int, typer.Option(min=1, help="Claims running at once per verifying agent (429 beyond).")
    ] = DEFAULT_CLAIM_PER_AGENT,
    claim_max_timeout: Annotated[
        float, typer.Option(min=0.001, help="Longest timeout a claim may ask for, in seconds.")
    ] = DEFAULT_CLAIM_MAX_TIMEOUT_S,
    db: DbOption = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json, docs at /docs) until Ctrl-C.

    With --tools, submitted plans are checked against those tools, and agent jobs
    (POST /api/jobs {"agent": NAME}) accepted for the agents they define; without, workers check
    plans when they run the job and no agent job is accepted (the server says so at start).
    A job's code always runs in the workers (affidavit worker --tools MODULE). Claim commands
    run in a bubblewrap sandbox; where `bwrap` (package bubblewrap) is missing, claims are
    refused (503). Exit codes: 0 stopped; 3 a bad option or store error.
    """
    import uvicorn

    from affidavit.api.app import create_app
    from affidavit.faces.ratelimit import RateLimit
    from affidavit.runtime import load_tools, registry

    with command(False):
        limit = None if rate_limit.strip().lower() == "off" else RateLimit.parse(rate_limit)
        for spec in tools or []:
            load_tools(spec)
        sock, store = _bind_and_open(host, port, db)
    sandbox = _claims_sandbox(insecure_claims_without_sandbox)
    from affidavit.claims.announce import containment

    try:
        app = create_app(
            store,
            tools=registry if tools else None,
            rate_limit=limit,
            claims_sandbox=sandbox,
            max_body_bytes=max_body_bytes,
            claim_limits=ClaimLimits(
                claim_concurrency, claim_concurrency_per_agent, claim_max_timeout
            ),
        )
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        output.err.print(
            f"affidavit API on http://{shown}:{bound} ({store.backend}); docs at /docs",
            markup=False,
        )
        output.err.print(containment(sandbox), markup=False)
        if not tools:
            output.err.print(NO_TOOLS_NOTE, markup=False)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        with background_sequencer(store, final=False):
            server.run(sockets=[sock])
    finally:
        sock.close()
        store.close()


def _bind_and_open(host: str, port: int, db: str | None) -> tuple[socket.socket, Store]:
    """Listen on ``host``:``port``, then open the store and admit its signing key; on any
    failure, close what was opened and raise."""
    from affidavit.record import Sealer
    from affidavit.store import open_store

    # the socket is bound first: a port in use is an error before anything is opened or
    # announced (not a banner followed by one)
    sock = _listen(host, port)
    try:
        store = open_store(database_url(db))
    except BaseException:
        sock.close()
        raise
    try:  # the API seals the jobs it cancels or fails: a key the database refuses stops it
        Sealer.for_store(store).admit(store)
    except BaseException:
        sock.close()
        store.close()
        raise
    return sock, store


def _claims_sandbox(insecure: bool) -> SandboxConfig | None:
    """How claim commands run: ``None`` (bubblewrap, warned about when it is missing), or
    without a sandbox when ``insecure``, with a warning."""
    if insecure:
        from affidavit.claims.sandbox import SandboxConfig

        output.err.print(
            "[bold red]WARNING: claim commands run WITHOUT a sandbox: any agent key can run "
            "allowed programs as this server's user.[/]"
        )
        return SandboxConfig(isolation="none")
    if find_bwrap() is None:
        output.err.print(
            f"[bold yellow]bubblewrap (`bwrap`) is not installed: claims will be refused. "
            f"Install the `{PACKAGE}` package.[/]"
        )
    return None


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``:``port`` (0: any free port).

    Raises:
        ConfigError: it cannot be bound (the port is in use, the address is not this host's).
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(
            f"cannot listen on {host}:{port}: {reason}",
            hint="Choose another --port (or stop what listens there), or another --host.",
        ) from None


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.add_typer(apikeys_app, name="apikeys")
