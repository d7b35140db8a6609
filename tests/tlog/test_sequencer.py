"""The log in the store: seals queued with their seal, integrated by the sequencer, proofs and
checkpoints that verify, on both backends."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from affidavit.core.checkpoint import Checkpoint, TlogProof
from affidavit.core.errors import StoreUnavailable
from affidavit.core.merkle import MemoryTree, leaf_hash, verify_consistency, verify_inclusion
from affidavit.core.note import open_note
from affidavit.core.seal import log_leaf
from affidavit.record._sealing import Sealer
from affidavit.store import Store, open_store
from affidavit.store.sqlite import SqliteStore, connect_raw
from affidavit.tlog import NotInLog, Sequencer, TransparencyLog, check_proof, parse_tile_path
from affidavit.tlog._log import tile_path
from tests.conftest import BACKENDS, PG_URL, allow_connections, refuse_connections
from tests.tlog.helpers import log_key, seal_jobs


@pytest.fixture
def sealer(store: Store) -> Sealer:
    return Sealer.for_store(store)


def test_seal_queues_its_leaf_in_its_transaction(store: Store, sealer: Sealer) -> None:
    (job,) = seal_jobs(store, sealer, 1)
    seal = store.get_seal(job)
    assert seal is not None
    with store.snapshot() as snap:
        assert snap.tlog_queued_for(job)
        assert snap.tlog_queue_length() == 1
        assert snap.tlog_leaf_of(job) is None
    with pytest.raises(NotInLog, match="queued"):
        TransparencyLog(store).job_proof(job)


def test_integrate_and_prove(store: Store, sealer: Sealer, tmp_path: Path) -> None:
    key = log_key(tmp_path)
    jobs = seal_jobs(store, sealer, 37)
    seq = Sequencer(store, key, origin="test.example/log", batch_size=10)
    result = seq.integrate()
    assert (result.busy, result.integrated, result.size) == (False, 37, 37)
    assert not seq.pending()
    log = TransparencyLog(store)
    vkey = key.verifier("test.example/log")
    note, _ = open_note(log.checkpoint(), [vkey])
    cp = Checkpoint.from_text(note.text)
    assert (cp.origin, cp.size) == ("test.example/log", 37)
    # the tree equals one built in memory from the seals' leaves, in sealing order
    tree = MemoryTree()
    leaves = []
    for job in jobs:
        seal = store.get_seal(job)
        assert seal is not None
        leaves.append(log_leaf(seal))
    tree.append(leaves)
    assert cp.root == tree.root()
    for i in (0, 9, 10, 36):
        proof = TlogProof.parse(log.job_proof(jobs[i]).encode())
        assert proof.index == i and proof.extra == leaves[i]
        verify_inclusion(leaf_hash(leaves[i]), i, 37, list(proof.proof), cp.root)
        check = check_proof(proof.encode(), vkey, expected_leaf=leaves[i])
        assert check.ok, check.errors
        assert check.leaf is not None and check.leaf["job_id"] == jobs[i]
    # checkpoints of the intermediate batch sizes were kept: consistency between them
    old_note, _ = open_note(log.checkpoint(20), [vkey])
    old = Checkpoint.from_text(old_note.text)
    verify_consistency(20, 37, log.consistency(20, 37), old.root, cp.root)
    assert old.root == tree.root(20)


def test_sequencer_appends_batches_across_runs(
    store: Store, sealer: Sealer, tmp_path: Path
) -> None:
    key = log_key(tmp_path)
    seq = Sequencer(store, key, batch_size=7)
    log = TransparencyLog(store)
    tree = MemoryTree()
    for n in (1, 5, 16, 3):
        jobs = seal_jobs(store, sealer, n)
        assert seq.integrate().size == tree.size + n
        for job in jobs:
            seal = store.get_seal(job)
            assert seal is not None
            tree.append([log_leaf(seal)])
        cp = Checkpoint.from_text(open_note(log.checkpoint(), [key.verifier(log.origin())])[0].text)
        assert cp.root == tree.root()
    assert log.consistency(1, 25) == tree.consistency_proof(1, 25)


def test_empty_log_gets_a_checkpoint(store: Store, tmp_path: Path) -> None:
    key = log_key(tmp_path)
    result = Sequencer(store, key).integrate()
    assert result.size == 0 and result.origin == key.default_origin()
    note, _ = open_note(TransparencyLog(store).checkpoint(), [key.verifier(result.origin)])
    assert note.text.split("\n")[1] == "0"


def test_lease_held_by_another_does_nothing(store: Store, sealer: Sealer, tmp_path: Path) -> None:
    key = log_key(tmp_path)
    seal_jobs(store, sealer, 3)
    with store.transaction() as tx:
        assert tx.tlog_take_lease("someone-else", 0.0, 9e18)
    result = Sequencer(store, key).integrate()
    assert result.busy and result.integrated == 0
    with store.snapshot() as snap:
        assert snap.tlog_queue_length() == 3


def test_origin_is_fixed_by_the_first_integration(store: Store, tmp_path: Path) -> None:
    from affidavit.core.errors import ConfigError

    key = log_key(tmp_path)
    Sequencer(store, key, origin="a.example/log").integrate()
    with pytest.raises(ConfigError, match=r"a\.example/log"):
        Sequencer(store, key, origin="b.example/log").integrate()


def test_concurrent_sequencers_build_one_tree(store: Store, sealer: Sealer, tmp_path: Path) -> None:
    key = log_key(tmp_path)
    key.key()
    jobs = seal_jobs(store, sealer, 60)
    seqs = [Sequencer(store, key, origin="test.example/log", batch_size=4) for _ in range(3)]
    threads = [threading.Thread(target=s.integrate) for s in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while Sequencer(store, key).pending():
        Sequencer(store, key).integrate()
    log = TransparencyLog(store)
    with store.snapshot() as snap:
        assert snap.tlog_state().size == 60
        leaves = snap.tlog_leaves(0, 100)
    assert sorted(x.job_id for x in leaves) == sorted(jobs)
    tree = MemoryTree()
    tree.append([x.leaf for x in leaves])
    cp = Checkpoint.from_text(
        open_note(log.checkpoint(), [key.verifier("test.example/log")])[0].text
    )
    assert cp.root == tree.root()


def test_tiles_and_entries(store: Store, sealer: Sealer, tmp_path: Path) -> None:
    key = log_key(tmp_path)
    seal_jobs(store, sealer, 300)
    Sequencer(store, key).integrate()
    log = TransparencyLog(store)
    with store.snapshot() as snap:
        leaves = [x.leaf for x in snap.tlog_leaves(0, 300)]
    tree = MemoryTree()
    tree.append(leaves)
    full = log.tile(parse_tile_path("0/000"))
    assert full == b"".join(tree.nodes[(0, i)] for i in range(256))
    partial = log.tile(parse_tile_path("0/001.p/44"))
    assert partial == b"".join(tree.nodes[(0, 256 + i)] for i in range(44))
    assert log.tile(parse_tile_path("1/000.p/1")) == tree.nodes[(8, 0)]
    bundle = log.tile(parse_tile_path("entries/001.p/44"))
    got, pos = [], 0
    while pos < len(bundle):
        n = int.from_bytes(bundle[pos : pos + 2], "big")
        got.append(bundle[pos + 2 : pos + 2 + n])
        pos += 2 + n
    assert got == leaves[256:]
    from affidavit.core.errors import NotFound

    with pytest.raises(NotFound):
        log.tile(parse_tile_path("0/001"))
    with pytest.raises(NotFound):
        log.tile(parse_tile_path("0/001.p/45"))


def test_tile_paths() -> None:
    assert tile_path(0, 1234067) == "0/x001/x234/067"
    assert tile_path(None, 5, 7) == "entries/005.p/7"
    p = parse_tile_path("2/x001/x234/067.p/9")
    assert (p.level, p.index, p.width) == (2, 1234067, 9)
    from affidavit.tlog import LogError

    for bad in ["64/000", "0/1", "0/x1/000", "0/000.p/0", "0/000.p/256", "x/000", "0/x000"]:
        with pytest.raises(LogError):
            parse_tile_path(bad)


@dataclass
class Outage:
    """A store whose database can be taken away for real and given back."""

    store: Store
    down: Callable[[], None]
    up: Callable[[], None]


@pytest.fixture(params=BACKENDS)
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outage]:
    """SQLite: another connection holds the write lock past the store's busy timeout.
    PostgreSQL: the database refuses connections and its sessions are ended (a database of its
    own; each try waits 1 s for a connection)."""
    if request.param == "sqlite":
        path = tmp_path / "outage.db"
        store: Store = SqliteStore(f"sqlite:///{path}", str(path), busy_timeout_s=0.05)
        holder = connect_raw(path, autocommit=True)
        yield Outage(
            store,
            down=lambda: holder.execute("BEGIN IMMEDIATE"),
            up=lambda: holder.execute("COMMIT"),
        )
        holder.close()
    else:
        database = request.getfixturevalue("pg_database")
        store = open_store(PG_URL.rsplit("/", 1)[0] + f"/{database}?pool_timeout=1")
        yield Outage(
            store,
            down=lambda: refuse_connections(database),
            up=lambda: allow_connections(database),
        )
    store.close()


def test_an_outage_is_one_warning_and_the_sequencer_carries_on(
    outage: Outage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The database goes away while a worker's sequencer runs: it warns once (the tries that
    follow are logged at debug level), says when the database is back, and integrates what
    was queued meanwhile."""
    store = outage.store
    (job,) = seal_jobs(store, Sealer.for_store(store), 1)
    outage.down()
    unavailable = "sequencer: the database is unavailable"
    with caplog.at_level(logging.DEBUG, logger="affidavit.tlog"):
        thread, stop = Sequencer(store, log_key(tmp_path)).start(interval=0.05)
        try:
            deadline = time.monotonic() + 20
            while sum(unavailable in r.getMessage() for r in caplog.records) < 3:
                assert time.monotonic() < deadline, "the sequencer did not try again"
                time.sleep(0.05)
            outage.up()
            while not _integrated(store, job):
                assert time.monotonic() < deadline, "nothing integrated after the outage"
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join(10)
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("affidavit") and r.levelno >= logging.WARNING
    ]
    assert len(warnings) == 2 and warnings[0].startswith(unavailable), warnings
    assert warnings[1] == "sequencer: the database is reachable again"
    assert not any(r.exc_info for r in caplog.records)


def _integrated(store: Store, job: str) -> bool:
    """Whether ``job``'s leaf is in the tree; ``False`` while this read, too, finds the database
    away (PostgreSQL's pool reconnects with a growing back-off after an outage)."""
    try:
        with store.snapshot() as snap:
            return snap.tlog_leaf_of(job) is not None
    except StoreUnavailable:
        return False
