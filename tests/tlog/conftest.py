"""Fixtures of the transparency-log tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.cli.test_cli import cli, json_of
from tests.cli.test_serve_cli import free_port


@pytest.fixture
def served(store_url: str) -> Iterator[tuple[str, str]]:
    """``(url, admin api key)`` of `affidavit serve` on the store (its own sequencer off: the
    test integrates when it means to)."""
    key = json_of(cli("apikeys", "create", "--agent", "ops", "--role", "admin",
                      "--db", store_url, "--json"))["key"]  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "serve", "--port", str(port), "--db", store_url,
         "--rate-limit", "off"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "AFFIDAVIT_LOG_SEQUENCER": "off"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.1)
        yield url, key
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
