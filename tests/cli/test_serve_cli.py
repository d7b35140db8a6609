"""``affidavit apikeys`` and ``affidavit serve`` as real subprocesses, on both backends."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.cli.test_cli import cli, json_of


def test_apikeys_create_list_revoke(store_url: str) -> None:
    created = cli("apikeys", "create", "--agent", "bot-1", "--role", "agent",
                  "--namespace", "team-a", "--db", store_url, "--json")  # fmt: skip
    assert created.returncode == 0, created.stderr
    doc = json_of(created)
    assert doc["key"].startswith(f"afv_{doc['key_id']}_")
    assert (doc["agent_id"], doc["role"], doc["namespace"]) == ("bot-1", "agent", "team-a")

    listed = cli("apikeys", "list", "--db", store_url, "--json")
    [row] = json_of(listed)
    assert row["key_id"] == doc["key_id"] and row["revoked_at"] is None
    assert doc["key"].split("_", 2)[2] not in listed.stdout  # the secret is never shown again
    assert "hash" not in json.dumps(row)

    human = cli("apikeys", "create", "--agent", "bot-2", "--role", "observer", "--db", store_url)
    assert human.returncode == 0 and human.stdout.strip().startswith("afv_")

    revoked = cli("apikeys", "revoke", doc["key_id"], "--db", store_url, "--json")
    assert revoked.returncode == 0 and json_of(revoked)["revoked_at"]
    again = cli("apikeys", "revoke", doc["key_id"], "--db", store_url, "--json")
    assert json_of(again)["revoked_at"] == json_of(revoked)["revoked_at"]  # the first time stands
    assert cli("apikeys", "revoke", "0123456789abcdef", "--db", store_url).returncode == 2

    for bad in (["--role", "root"], ["--role", "agent", "--namespace", "has space"],
                ["--role", "agent", "--agent", ""]):  # fmt: skip
        args = ["apikeys", "create", "--agent", "x", *bad, "--db", store_url, "--json"]
        r = cli(*args)
        assert r.returncode == 3, (bad, r.stdout)
        assert json_of(r)["error"]["code"] == "config_error"
    assert len(json_of(cli("apikeys", "list", "--db", store_url, "--json"))) == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_answers_on_loopback(store_url: str) -> None:
    key = json_of(cli("apikeys", "create", "--agent", "ops", "--role", "admin", "--db", store_url,
                      "--json"))["key"]  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "serve", "--port", str(port), "--db", store_url,
         "--rate-limit", "off"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.1)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{url}/api/jobs", headers=auth).json()["jobs"] == []
        assert httpx.get(f"{url}/api/jobs").status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)


def test_serve_refuses_a_bad_rate_limit(store_url: str) -> None:
    r = cli("serve", "--rate-limit", "fast", "--db", store_url)
    assert r.returncode == 3 and "invalid rate limit" in r.stderr


def test_serve_on_a_port_in_use_says_so_before_anything_else(tmp_path: Path) -> None:
    """The socket is bound before the database is opened or a banner printed: a port in use
    is one error (exit 3), and no database file is created."""
    db = tmp_path / "new.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = cli("serve", "--port", str(port), "--db", f"sqlite:///{db}")
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert "affidavit API on" not in r.stderr and "Traceback" not in r.stderr
    assert not db.exists()


def test_serve_announces_the_port_it_bound(store_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "serve", "--port", "0", "--db", store_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        while banner and not banner.startswith("affidavit API on"):  # (a warning before it)
            banner = proc.stderr.readline()
        assert banner.startswith("affidavit API on http://127.0.0.1:"), banner
        port = int(banner.split("127.0.0.1:", 1)[1].split(" ", 1)[0])
        assert port > 0 and httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
