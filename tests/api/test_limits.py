"""What one request may cost the server, on both backends: a body is authenticated before it
is read and capped; claims run on threads of their own, capped per agent and in all; /health
answers while the claims run; /metrics is for admins."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from affidavit.api.app import create_app
from affidavit.claims import ClaimService
from affidavit.faces.limits import ClaimLimits
from affidavit.faces.ratelimit import RateLimit
from affidavit.store import open_store
from tests.api.conftest import TOOLS, Api, Server, make_keys

MiB = 1 << 20


@pytest.fixture(scope="module")
def guarded(db_url: str) -> Iterator[Api]:
    """A server with the default body limit and small claim caps (2 per agent, 3 in all)."""
    store = open_store(db_url)
    keys = make_keys(store)
    service = ClaimService(store)
    for agent_id, namespace, role in [
        ("bot-a", "a", "agent"),
        ("root", "ops", "admin"),
        ("worker-a", "a", "agent"),
    ]:
        service.add_agent(agent_id, namespace=namespace, role=role)
    app = create_app(
        store,
        tools=TOOLS,
        rate_limit=RateLimit(100_000, 1),
        claim_limits=ClaimLimits(max_concurrent=3, per_agent=2, max_timeout_s=60),
    )
    with Server(app) as url:
        yield Api(url, store, None, keys)  # type: ignore[arg-type]
    store.close()


def raw_request(url: str, head: str, first: bytes) -> tuple[int, dict[str, Any]]:
    """Send the request line and headers and the first bytes of a body, then read the answer
    without sending the rest (a server that waits for the whole body never answers)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n" + first)
        data = b""
        while b"\r\n\r\n" not in data or not _complete(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    body = data.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(body)


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def headers(path: str, key: str | None, **extra: str) -> str:
    lines = [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json"]
    if key is not None:
        lines.append(f"Authorization: {key}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in extra.items()]
    return "\r\n".join(lines) + "\r\n"


def test_a_50_mb_body_without_a_key_is_refused_before_it_is_read(guarded: Api) -> None:
    status, body = raw_request(
        guarded.url, headers("/api/jobs", None, Content_Length=str(50 * MiB)), b"{" * 65536
    )
    assert status == 401 and body["error"]["code"] == "unauthorized"
    status, body = raw_request(
        guarded.url,
        headers("/api/jobs", guarded.keys["bad"], Content_Length=str(50 * MiB)),
        b"{" * 65536,
    )
    assert status == 401


def test_a_50_mb_body_with_a_key_is_413_before_it_is_read(guarded: Api) -> None:
    status, body = raw_request(
        guarded.url,
        headers("/api/jobs", guarded.keys["agent_a"], Content_Length=str(50 * MiB)),
        b"{" * 65536,
    )
    assert status == 413
    assert set(body["error"]) == {"code", "message", "hint"}
    assert body["error"]["code"] == "payload_too_large"


def test_a_streamed_body_is_read_only_up_to_the_limit(guarded: Api) -> None:
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * 64 * 1024)
    status, body = raw_request(
        guarded.url,
        headers("/api/jobs", guarded.keys["agent_a"], Transfer_Encoding="chunked"),
        chunk * 20,  # 1.25 MiB sent, the end of the body never
    )
    assert status == 413 and body["error"]["code"] == "payload_too_large"


def test_health_with_a_body_does_not_stall_the_server(guarded: Api) -> None:
    status, _ = raw_request(
        guarded.url, headers("/health", None, Content_Length=str(30 * MiB)), b"x" * 65536
    )
    assert status == 401
    with guarded.client(None) as c:
        assert c.get("/health").json()["status"] == "ok"


def test_a_body_under_the_limit_is_served(guarded: Api) -> None:
    with guarded.client("agent_a") as c:
        r = c.post("/api/jobs", json={"plan": {"name": "x", "nodes": []}, "padding": "x" * 1000})
    assert r.status_code in (201, 422), r.text  # judged by the route, not the guard
    assert r.json().get("error", {}).get("code") != "payload_too_large"


def _running(marker: str) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    count += 1
            except OSError:
                pass
    return count


def _end_when_answered(futures: list[Future[Any]], refused: int, marker: str) -> None:
    """Once ``refused`` of the requests have been answered (the refusals), end the sleeps of
    the claims that run: they need to last only until then."""
    deadline = time.monotonic() + 60
    while sum(f.done() for f in futures) < refused:
        assert time.monotonic() < deadline, "the refusals did not come"
        time.sleep(0.01)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)


def claim_body(seconds: str) -> dict[str, Any]:
    return {
        "agent_id": "worker-a",
        "claim_type": "custom",
        "claim": {"return_code": 0},
        "command": f"sleep {seconds}",
        "timeout_s": 30,
    }


def test_health_answers_while_45_claims_are_sent(guarded: Api) -> None:
    seconds = f"{10 + uuid.uuid4().int % 1000 / 1000:.3f}"  # a marker: this test's sleeps
    with ThreadPoolExecutor(45) as pool, guarded.client("admin") as c:

        def post() -> Any:
            with guarded.client("admin") as own:
                return own.post("/api/claims/verify", json=claim_body(seconds))

        futures: list[Future[Any]] = [pool.submit(post) for _ in range(45)]
        deadline = time.monotonic() + 30
        while _running(f"sleep\x00{seconds}") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _running(f"sleep\x00{seconds}") > 0, "no claim started"
        health = c.get("/health")
        still_running = sum(not f.done() for f in futures)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert still_running > 0  # /health did not wait for the claims
        _end_when_answered(futures, 43, f"sleep\x00{seconds}")
        answers = [f.result() for f in futures]
    statuses = sorted(r.status_code for r in answers)
    assert statuses.count(200) == 2  # the agent's cap
    busy = [r for r in answers if r.status_code == 429]
    assert len(busy) == 43
    assert all(
        r.headers["retry-after"] and r.json()["error"]["code"] == "claims_busy" for r in busy
    )


def test_the_global_claim_cap_is_503(guarded: Api) -> None:
    seconds = f"{8 + uuid.uuid4().int % 1000 / 1000:.3f}"
    body = claim_body(seconds)
    made = ClaimService(guarded.store).make_claim(
        "worker-a", "custom", body["claim"], body["command"]
    )
    started = threading.Barrier(5)

    def post(who: str) -> Any:
        started.wait()
        with guarded.client(who) as c:  # root and bot-a both verify worker-a's claim
            if who == "admin":
                return c.post("/api/claims/verify", json=body)
            return c.post(f"/api/claims/{made.claim_id}/verify", json={"timeout_s": 30})

    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(post, ["admin", "admin", "agent_a", "agent_a", "agent_a"]))
    statuses = sorted(r.status_code for r in answers)
    assert statuses.count(200) == 3 and (429 in statuses or 503 in statuses)
    for r in answers:
        if r.status_code == 503:
            assert r.headers["retry-after"] and r.json()["error"]["code"] == "claims_busy"


def test_a_timeout_above_the_operators_cap_is_refused(guarded: Api) -> None:
    with guarded.client("admin") as c:
        r = c.post("/api/claims/verify", json={**claim_body("0"), "timeout_s": 600})
    assert r.status_code == 422 and "limit of 60" in r.json()["error"]["message"]


def test_metrics_are_for_admins(guarded: Api) -> None:
    for who, status in (("observer_a", 403), ("agent_a", 403), ("admin", 200), ("none", 401)):
        with guarded.client(None if who == "none" else who) as c:
            assert c.get("/metrics").status_code == status, who
