"""Real outside worlds for the confirmation tests: files, an HTTP server on loopback, SQL rows.

Each world has a tool that changes it the way an agent's tool would (and records what it left
behind with ``state_changed``), a way for "someone else" to change it afterwards, and the
shipped verifier that checks it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg

from affidavit import ToolContext
from affidavit.runtime._confirm import ResourceVerifier
from affidavit.runtime._verifiers import FileVerifier, HttpVerifier, SqlRowVerifier, record_file
from affidavit.store.postgres import split_url
from affidavit.store.sqlite import connect_raw

# --- HTTP -------------------------------------------------------------------------------------


class ResourceServer:
    """A tiny HTTP resource store on 127.0.0.1: ``PUT`` a JSON body (a new ``ETag`` and
    ``version`` each time), ``GET`` it (``304`` for a matching ``If-None-Match``), ``DELETE``."""

    def __init__(self) -> None:
        self.resources: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any = None, etag: str | None = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(code)
                if etag:
                    self.send_header("ETag", etag)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                with server.lock:
                    server.requests += 1
                    found = server.resources.get(self.path)
                if found is None:
                    self._send(404, {"error": "not found"})
                elif self.headers.get("If-None-Match") == found["etag"]:
                    self._send(304, etag=found["etag"])
                else:
                    self._send(200, found["body"], found["etag"])

            def do_PUT(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    version = server.resources.get(self.path, {}).get("version", 0) + 1
                    etag = f'"{self.path.strip("/").replace("/", "-")}-v{version}"'
                    stored = {**body, "version": version}
                    server.resources[self.path] = {"etag": etag, "version": version, "body": stored}
                self._send(200, stored, etag)

            def do_DELETE(self) -> None:
                with server.lock:
                    server.resources.pop(self.path, None)
                self._send(204)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ResourceServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --- worlds -----------------------------------------------------------------------------------


class World:
    """One kind of outside resource a tool changes."""

    kind: str
    verifier: ResourceVerifier

    def act(self, ctx: ToolContext) -> dict[str, Any]:
        """The tool's real effect; records the changed resource on ``ctx``."""
        raise NotImplementedError

    def change(self) -> None:
        """Someone else changes the resource after the tool committed."""
        raise NotImplementedError


class FileWorld(World):
    kind = "file"

    def __init__(self, directory: Path) -> None:
        self.path = directory / "report.txt"
        self.verifier = FileVerifier()

    def act(self, ctx: ToolContext) -> dict[str, Any]:
        self.path.write_text(f"report of {ctx.job_id}\n")
        record_file(ctx, self.path)
        return {"path": str(self.path)}

    def change(self) -> None:
        with self.path.open("a") as f:
            f.write("edited by hand\n")


class HttpWorld(World):
    kind = "http"

    def __init__(self, server: ResourceServer) -> None:
        self.url = f"{server.base}/tickets/7"
        self.verifier = HttpVerifier(timeout=5)

    def act(self, ctx: ToolContext) -> dict[str, Any]:
        response = httpx.put(self.url, json={"status": "refunded", "by": ctx.external_key})
        response.raise_for_status()
        etag = response.headers["etag"]
        ctx.record_state_change("http", self.url, "update", etag=etag)
        return {"etag": etag}

    def change(self) -> None:
        httpx.put(self.url, json={"status": "reopened"}).raise_for_status()


class SqlWorld(World):
    """An ``accounts`` row whose ``version`` column goes up with every update."""

    kind = "sql_row"

    def __init__(self, url: str) -> None:
        self.url = url
        with self._connect() as conn:
            conn.execute("DROP TABLE IF EXISTS accounts")
            conn.execute(
                "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER, version INTEGER)"
            )
            conn.execute("INSERT INTO accounts VALUES ('acct-1', 100, 1)")
        self.verifier = SqlRowVerifier(url, table="accounts")

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        if self.url.startswith("sqlite:///"):
            conn = connect_raw(self.url[len("sqlite:///") :])
            try:
                with conn:
                    yield conn
            finally:
                conn.close()
        else:
            conninfo, schema = split_url(self.url)
            with psycopg.connect(conninfo, autocommit=True) as pg:
                pg.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                pg.execute(f'SET search_path TO "{schema}"')
                yield _Qmark(pg)

    def _update(self, amount: int) -> int:
        with self._connect() as conn:
            conn.execute(
                "UPDATE accounts SET balance = balance + ?, version = version + 1 WHERE id = ?",
                (amount, "acct-1"),
            )
            row = conn.execute("SELECT version FROM accounts WHERE id = ?", ("acct-1",)).fetchone()
        return int(row[0])

    def act(self, ctx: ToolContext) -> dict[str, Any]:
        version = self._update(-30)
        ctx.record_state_change("sql_row", "acct-1", "update", version=version)
        return {"version": version}

    def change(self) -> None:
        self._update(5)


class _Qmark:
    """psycopg with sqlite3's ``?`` placeholders, so both worlds share their SQL."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = ()) -> Any:
        return self.conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
