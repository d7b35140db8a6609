"""``affidavit mcp --transport http`` against hostile callers, as a real subprocess on loopback,
on both backends: no key, an oversize body, a flood of requests, more sessions than a key may
hold, a session left idle. The real MCP client for sessions, raw httpx and sockets for the
rest."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from affidavit.faces.auth import create_api_key
from affidavit.store import open_store
from tests.integrations.test_mcp_server import _free_port, _wait_http

PROTOCOL = "2025-06-18"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": PROTOCOL,
        "capabilities": {},
        "clientInfo": {"name": "hostile", "version": "0"},
    },
}
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
MAX_BODY = 65536


@dataclass
class Server:
    url: str
    port: int
    db_url: str

    def key(self, name: str) -> str:
        """A new agent key (each test its own: sessions and rate limits are per key)."""
        store = open_store(self.db_url)
        try:
            _, key = create_api_key(store, agent_id=name, role="agent", namespace="a")
        finally:
            store.close()
        return key


def _serve(db_url: str, *options: str) -> Iterator[Server]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "mcp", "--transport", "http", "--port", str(port),
         "--db", db_url, *options],
        env={**os.environ},
    )  # fmt: skip
    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc)
        yield Server(f"http://127.0.0.1:{port}/mcp", port, db_url)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def server(db_url: str) -> Iterator[Server]:
    """Two sessions per key, 64 KiB bodies, no rate limit."""
    open_store(db_url).close()  # (the schema, before the server opens it)
    yield from _serve(db_url, "--sessions-per-key", "2", "--max-body-bytes", str(MAX_BODY),
                      "--rate-limit", "off")  # fmt: skip


@pytest.fixture(scope="module")
def tight(db_url: str, server: Server) -> Iterator[Server]:
    """One session per key that idles out after 1.5 s; 4 requests a minute per key."""
    yield from _serve(db_url, "--sessions-per-key", "1", "--session-idle-timeout", "1.5",
                      "--rate-limit", "4/60")  # fmt: skip


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def initialize(url: str, key: str | None) -> httpx.Response:
    headers = {**ACCEPT, **(bearer(key) if key is not None else {})}
    return httpx.post(url, json=INITIALIZE, headers=headers, timeout=30)


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def test_no_key_is_401_before_anything(server: Server) -> None:
    for key in (None, "afv_0123456789abcdef_" + "x" * 43):
        response = initialize(server.url, key)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert error_code(response) == "unauthorized"
        assert "mcp-session-id" not in response.headers
    for method in ("GET", "DELETE"):
        assert httpx.request(method, server.url, headers=ACCEPT).status_code == 401
    tools_list = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert httpx.post(server.url, json=tools_list, headers=ACCEPT).status_code == 401


def test_the_real_client_with_a_key_lists_the_tools(server: Server) -> None:
    key = server.key("lister")

    async def go() -> set[str]:
        http = create_mcp_http_client(bearer(key))
        async with Client(streamable_http_client(server.url, http_client=http)) as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert "verify_job" in anyio.run(go)


def _raw_post(port: int, headers: str, body: bytes) -> bytes:
    """Send a request's head and ``body`` (not all the body the head declares) and read the
    answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(headers.encode() + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_an_oversize_body_is_413_without_reading_it(server: Server) -> None:
    key = server.key("big")
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"Content-Length: {100 * MAX_BODY}\r\n")  # fmt: skip
    answer = _raw_post(server.port, head, b"{" * 1024)  # 1 KiB of the 6.4 MB declared
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"payload_too_large"' in answer
    # a streamed body is cut at the cap
    chunk = b"%x\r\n%s\r\n" % (8192, b"[" * 8192)
    head = head.replace(f"Content-Length: {100 * MAX_BODY}", "Transfer-Encoding: chunked")
    answer = _raw_post(server.port, head, chunk * (MAX_BODY // 8192 + 2))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # without a key, the body is never looked at: 401
    keyless = head.replace(f"Authorization: Bearer {key}\r\n", "")
    assert _raw_post(server.port, keyless, chunk).startswith(b"HTTP/1.1 401")


def test_the_rate_limit_is_per_key(tight: Server) -> None:
    key, other = tight.key("flood"), tight.key("calm")
    answers = [httpx.get(tight.url, headers={**ACCEPT, **bearer(key)}) for _ in range(5)]
    assert [a.status_code == 429 for a in answers] == [False] * 4 + [True]
    assert error_code(answers[4]) == "rate_limited"
    assert int(answers[4].headers["retry-after"]) >= 1
    assert httpx.get(tight.url, headers={**ACCEPT, **bearer(other)}).status_code != 429


def test_a_key_holds_at_most_its_sessions(server: Server) -> None:
    """Two sessions open: a third is refused with 429 and Retry-After (the two are kept),
    another key still opens one, and closing one (DELETE) makes room again. A session id is
    useless with another key (404)."""
    key, other = server.key("many"), server.key("other")
    opened = [initialize(server.url, key) for _ in range(2)]
    assert [o.status_code for o in opened] == [200, 200]
    sids = [o.headers["mcp-session-id"] for o in opened]
    refused = initialize(server.url, key)
    assert refused.status_code == 429
    assert error_code(refused) == "too_many_sessions"
    assert int(refused.headers["retry-after"]) >= 1
    assert "mcp-session-id" not in refused.headers
    for sid in sids:  # both still serve
        assert _list_tools(server.url, key, sid).status_code == 200
    theirs = initialize(server.url, other)
    assert theirs.status_code == 200
    stolen = _list_tools(server.url, key, theirs.headers["mcp-session-id"])
    assert stolen.status_code == 404
    closed = httpx.delete(server.url, headers={**bearer(key), "mcp-session-id": sids[0],
                                               "mcp-protocol-version": PROTOCOL})  # fmt: skip
    assert closed.status_code < 300, closed.text
    assert _list_tools(server.url, key, sids[0]).status_code == 404
    assert initialize(server.url, key).status_code == 200


def _list_tools(url: str, key: str, session_id: str) -> httpx.Response:
    headers = {**ACCEPT, **bearer(key), "mcp-session-id": session_id,
               "mcp-protocol-version": PROTOCOL}  # fmt: skip
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    return httpx.post(url, json=body, headers=headers, timeout=30)


def test_an_idle_session_expires(tight: Server) -> None:
    """The key's one session is left idle: a new one is refused until it expires (the
    Retry-After says when), then opens; the idle one's id answers 404."""
    key = tight.key("idle")
    first = initialize(tight.url, key)
    assert first.status_code == 200, first.text
    sid = first.headers["mcp-session-id"]
    refused = initialize(tight.url, key)
    assert refused.status_code == 429 and error_code(refused) == "too_many_sessions"
    time.sleep(float(refused.headers["retry-after"]))  # as a client told to wait does
    second = initialize(tight.url, key)
    assert second.status_code == 200, second.text
    gone = _list_tools(tight.url, key, sid)
    assert gone.status_code == 404
    assert json.loads(gone.text)["error"]["message"] == "Session not found"
