"""Reading the leaves before a leaf and checking them against the checkpoint: a log that serves
other leaves than its tree's (one left out, one swapped), a bundle that is too large or
malformed, or a leaf past the limit is refused, never taken as "no earlier leaf". A real HTTP
server on loopback plays the lying log. Both backends."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from affidavit.core.checkpoint import Checkpoint
from affidavit.core.note import parse_note
from affidavit.record._sealing import Sealer
from affidavit.store import Store
from affidavit.tlog import (
    EntriesError,
    HttpEntries,
    Sequencer,
    StoreEntries,
    TransparencyLog,
    first_of_record,
)
from affidavit.tlog._entries import MAX_PREFIX_LEAVES, leaves_before, parse_bundle
from tests.tlog.helpers import log_key, seal_jobs

Serve = Callable[[Callable[[str], bytes | None]], str]


@pytest.fixture
def lying_log() -> Iterator[Serve]:
    """``serve(answer)``: the base URL of a loopback server answering each GET path with
    ``answer(path)`` (``None``: 404)."""
    servers: list[ThreadingHTTPServer] = []

    def serve(answer: Callable[[str], bytes | None]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = answer(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def _log(store: Store, tmp_path: Path, n: int) -> tuple[list[str], Checkpoint]:
    jobs = seal_jobs(store, Sealer.for_store(store), n)
    Sequencer(store, log_key(tmp_path), origin="test.example/log").integrate()
    note = TransparencyLog(store).checkpoint()
    return jobs, Checkpoint.from_text(parse_note(note).text)


def _relay(
    store: Store, edit: Callable[[str, bytes], bytes | None]
) -> Callable[[str], bytes | None]:
    """Answers as the store's log would, through ``edit(path, body)``."""
    source = StoreEntries(store)
    log = TransparencyLog(store)

    def answer(path: str) -> bytes | None:
        if path.startswith("/log/consistency"):
            query = dict(p.split("=") for p in path.split("?", 1)[1].split("&"))
            hashes = log.consistency(int(query["old"]), int(query["new"]))
            body = json.dumps({"proof": [base64.b64encode(h).decode() for h in hashes]})
            return edit(path, body.encode())
        tail = path.removeprefix("/log/tile/entries/")
        index, _, width = tail.partition(".p/")
        return edit(path, source.bundle(int(index), int(width) if width else 256))

    return answer


def test_the_store_and_an_honest_server_agree(
    store: Store, tmp_path: Path, lying_log: Serve
) -> None:
    jobs, checkpoint = _log(store, tmp_path, 5)
    url = lying_log(_relay(store, lambda _path, body: body))
    http = HttpEntries(url)
    try:
        for source in (StoreEntries(store), http):
            assert first_of_record(source, checkpoint, 3, jobs[3]).index is None
            assert first_of_record(source, checkpoint, 3, jobs[1]).index == 1
            assert first_of_record(source, checkpoint, 0, jobs[0]).read == 0
    finally:
        http.close()


def test_a_log_that_serves_other_leaves_is_refused(
    store: Store, tmp_path: Path, lying_log: Serve
) -> None:
    jobs, checkpoint = _log(store, tmp_path, 5)
    stranger = seal_jobs(store, Sealer.for_store(store), 1)  # queued, not in this tree

    def swap(path: str, body: bytes) -> bytes:
        if "entries" not in path:
            return body
        leaves = parse_bundle(body, 5)
        with store.snapshot() as snap:
            other = snap.tlog_leaves(0, 10)[0].leaf.replace(jobs[0].encode(), stranger[0].encode())
        leaves[1] = other  # the job's own leaf 1 hidden behind another
        return b"".join(len(x).to_bytes(2, "big") + x for x in leaves)

    http = HttpEntries(lying_log(_relay(store, swap)))
    try:
        with pytest.raises(EntriesError, match="not those of the checkpointed tree"):
            first_of_record(http, checkpoint, 3, jobs[1])
    finally:
        http.close()
    dropped = HttpEntries(lying_log(_relay(store, lambda p, b: b[:-10] if "entries" in p else b)))
    try:
        with pytest.raises(EntriesError, match="exactly 5 leaves"):
            first_of_record(dropped, checkpoint, 3, jobs[1])
    finally:
        dropped.close()


def test_bounds(store: Store, tmp_path: Path, lying_log: Serve) -> None:
    jobs, checkpoint = _log(store, tmp_path, 2)
    big = HttpEntries(lying_log(lambda _path: b"\x00" * (5 << 20)))
    try:
        with pytest.raises(EntriesError, match="more than"):
            first_of_record(big, checkpoint, 1, jobs[1])
    finally:
        big.close()
    gone = HttpEntries(lying_log(lambda _path: None))
    try:
        with pytest.raises(EntriesError, match="HTTP 404"):
            first_of_record(gone, checkpoint, 1, jobs[1])
    finally:
        gone.close()
    with pytest.raises(EntriesError, match="too many to read"):
        list(leaves_before(StoreEntries(store), MAX_PREFIX_LEAVES + 1, MAX_PREFIX_LEAVES + 2))


def test_the_sequencer_keeps_the_first_of_two_queued_leaves_for_a_job() -> None:
    from affidavit.store import QueuedLeaf
    from affidavit.tlog._sequencer import screen

    def leaf(job: str, n: int) -> bytes:
        return json.dumps({"job_id": job, "n": n}).encode()

    batch = [
        QueuedLeaf(1, "a", leaf("a", 1), 0.0),
        QueuedLeaf(2, "b", leaf("b", 1), 0.0),
        QueuedLeaf(3, "a", leaf("a", 2), 0.0),  # the same batch: the first wins
        QueuedLeaf(4, "c", leaf("c", 1), 0.0),  # logged before, at 0
        QueuedLeaf(5, "d", b"\xff", 0.0),
        QueuedLeaf(6, "e", b"x" * 70_000, 0.0),
    ]
    accepted, refused = screen(batch, {"c": 0}, 10)
    assert [q.seq for q in accepted] == [1, 2]
    assert [(q.seq, why, first) for q, why, first in refused] == [
        (3, "duplicate", 10),
        (4, "duplicate", 0),
        (5, "malformed", None),
        (6, "malformed", None),
    ]
