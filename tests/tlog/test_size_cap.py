"""A witness or monitor reading a log that answers a huge body stops at its cap: bounded memory
and a clear error, for every resource it reads. Real loopback HTTP."""

from __future__ import annotations

import base64
import json
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from affidavit.core.checkpoint import Checkpoint
from affidavit.core.merkle import leaf_hash, root_of
from affidavit.core.note import sign_note
from affidavit.tlog import LogKey, LogReadError, Monitor, Witness, WitnessError
from affidavit.tlog._fetch import MAX_RESPONSE_BYTES
from tests.cli.test_cli import cli
from tests.tlog.loopback import Answer, endless, serve

ORIGIN = "test.example/log"


def _leaf(job_id: str) -> bytes:
    doc = {
        "type": "affidavit.seal/v1",
        "job_id": job_id,
        "event_count": 2,
        "event_chain_root_hash": "a" * 64,
        "key_id": "b" * 16,
        "seal_sha256": "c" * 64,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


class FakeLog:
    """A log of leaves ``job-0``, ``job-1`` served by hand at size 1 or 2; the resource named
    in ``huge`` answers 256 MiB instead."""

    def __init__(self, tmp_path: Path) -> None:
        self.key = LogKey(tmp_path / "log.key")
        self.leaves = [_leaf("job-0"), _leaf("job-1")]
        self.size = 1
        self.huge: str | None = None

    def vkey(self) -> str:
        return self.key.verifier(ORIGIN).vkey()

    def _body(self, method: str, path: str, query: dict[str, list[str]]) -> bytes:
        leaves = self.leaves[: self.size]
        if method == "POST":
            return b'{"added": true}'
        if path == "/log/checkpoint":
            cp = Checkpoint(ORIGIN, self.size, root_of(leaves))
            return sign_note(cp.text(), self.key.signer(ORIGIN)).encode()
        if path == "/log/consistency":
            assert query == {"old": ["1"], "new": ["2"]}
            proof = [base64.b64encode(leaf_hash(self.leaves[1])).decode()]
            return json.dumps({"old_size": 1, "new_size": 2, "proof": proof}).encode()
        if path == f"/log/tile/0/000.p/{self.size}":
            return b"".join(leaf_hash(x) for x in leaves)
        if path == f"/log/tile/entries/000.p/{self.size}":
            return b"".join(len(x).to_bytes(2, "big") + x for x in leaves)
        raise AssertionError(f"unexpected {method} {path}")

    def __call__(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        url = urlsplit(path)
        chunks: Iterable[bytes]
        if self.huge is not None and url.path.startswith(self.huge):
            chunks = endless()
        else:
            chunks = [self._body(method, url.path, parse_qs(url.query))]
        return 200, chunks


RESOURCES = ["/log/checkpoint", "/log/consistency", "/log/tile/0/000.p/2",
             "/log/tile/entries/000.p/2"]  # fmt: skip
CASES = [(a, r) for a in ("witness", "monitor") for r in RESOURCES]
CASES.append(("witness", "/log/cosignatures"))  # the answer to its hand-back


@pytest.mark.parametrize(("auditor", "huge"), CASES)
def test_a_huge_answer_is_dropped_at_the_cap(tmp_path: Path, huge: str, auditor: str) -> None:
    log = FakeLog(tmp_path)
    with serve(log) as served:
        verifier = LogKey(tmp_path / "log.key").verifier(ORIGIN)
        reader: Witness | Monitor
        if auditor == "witness":
            reader = Witness(tmp_path / "w", "w.example/w", log_url=served.url, log_key=verifier)
        else:
            reader = Monitor(tmp_path / "m", log_url=served.url, log_key=verifier)
        try:
            reader.step()  # size 1: audited, recorded
            served.sent.clear()
            log.size, log.huge = 2, huge
            tracemalloc.start()
            try:
                with pytest.raises(
                    (LogReadError, WitnessError), match=r"over \d+ bytes; stopped reading"
                ):
                    reader.step()
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        finally:
            reader.close()
        sent = served.wait_sent(huge)
    assert peak < 8 * MAX_RESPONSE_BYTES, peak
    assert sent < 64 << 20, sent  # of 256 MiB: the reader hung up near its cap


@pytest.mark.parametrize("command", ["witness", "monitor"])
def test_the_cli_reports_a_huge_checkpoint(tmp_path: Path, command: str) -> None:
    log = FakeLog(tmp_path)
    log.huge = "/log/checkpoint"
    with serve(log) as served:
        common = ["--state", str(tmp_path / "s"), "--log-url", served.url,
                  "--log-key", log.vkey()]  # fmt: skip
        if command == "witness":
            done = cli("witness", "run", "--once", "--name", "w.example/w", *common)
        else:
            done = cli("log", "monitor", *common)
        sent = served.wait_sent("/log/checkpoint")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "the log's answer is over 131072 bytes; stopped reading" in done.stderr
    assert sent < 64 << 20


def test_a_trickling_answer_meets_the_deadline() -> None:
    """A log that sends its checkpoint a byte at a time stays under every read timeout; the
    reader's deadline still ends it, without waiting for the body to end."""
    import time

    from affidavit.tlog import LogClient

    def trickle(method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        def slowly() -> Iterable[bytes]:
            for _ in range(400):
                time.sleep(0.02)
                yield b"x"

        return 200, slowly()

    with serve(trickle) as served:
        client = LogClient(served.url, deadline=1.0)
        try:
            with pytest.raises(LogReadError, match="took over 1 s to answer"):
                client.checkpoint()
        finally:
            client.close()
        sent = served.wait_sent("/log/checkpoint")
    assert sent < 400, sent  # it hung up before the end
