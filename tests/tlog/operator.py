"""The operator who holds every key and the database, and appends to the log by SQL: leaves the
store (and the sequencer) would refuse are written straight into the log's tables, with the
nodes and a checkpoint signed by the real log key, so that the tree stays consistent — what only
a witness or a monitor reading the entries can catch."""

from __future__ import annotations

import json
import time

from affidavit.core.checkpoint import Checkpoint
from affidavit.core.events import utc_now
from affidavit.core.merkle import leaf_hash, new_nodes, root_from, root_nodes
from affidavit.core.note import sign_note
from affidavit.tlog import LogKey, default_log_key_path
from tests.verify.helpers import RawDb


def _node_id(level: int, index: int) -> int:
    return (level << 48) | index


def _drop_job_uniqueness(raw: RawDb) -> None:
    """Drop whatever makes the log's tables refuse a second leaf for a job (a unique index, a
    constraint or a trigger): the operator owns the database."""
    if raw.url.startswith("sqlite:///"):
        found = raw.rows(
            "SELECT type, name FROM sqlite_master WHERE tbl_name = 'tlog_leaves' AND sql IS NOT "
            "NULL AND (type = 'trigger' OR (type = 'index' AND upper(sql) LIKE '%UNIQUE%'))"
        )
        for kind, name in found:
            raw.execute(f'DROP {kind.upper()} "{name}"')
        return
    for (name,) in raw.rows(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'tlog_leaves'::regclass "
        "AND contype IN ('u', 'x')"
    ):
        raw.execute(f'ALTER TABLE tlog_leaves DROP CONSTRAINT "{name}"')
    # (read from pg_index for this table alone: pg_indexes computes every index's definition,
    # which fails while another session drops its schema)
    for (name,) in raw.rows(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = 'tlog_leaves'::regclass AND i.indisunique AND NOT i.indisprimary"
    ):
        raw.execute(f'DROP INDEX "{name}"')
    for (name,) in raw.rows(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'tlog_leaves'::regclass AND NOT tgisinternal"
    ):
        raw.execute(f'DROP TRIGGER "{name}" ON tlog_leaves')


def leaf_at(url: str, index: int) -> bytes:
    ((leaf,),) = RawDb(url).rows("SELECT leaf FROM tlog_leaves WHERE idx = ?", (index,))
    return bytes(leaf)


def resealed(leaf: bytes) -> bytes:
    """The leaf of a re-seal of the same job (one event fewer, another seal)."""
    doc = json.loads(leaf)
    doc["event_count"] -= 1
    doc["seal_sha256"] = "0" * 64
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def append(url: str, leaves: list[tuple[str, bytes]]) -> int:
    """Append ``(job_id, leaf)`` pairs to the log by SQL, with the nodes they complete and a
    checkpoint signed by the log key; the new size."""
    raw = RawDb(url)
    _drop_job_uniqueness(raw)
    ((size, origin),) = raw.rows("SELECT size, origin FROM tlog_state")
    frontier = {}
    for level, index in root_nodes(size):
        ((h,),) = raw.rows("SELECT hash FROM tlog_nodes WHERE id = ?", (_node_id(level, index),))
        frontier[(level, index)] = bytes(h)
    created = new_nodes(size, [leaf_hash(leaf) for _, leaf in leaves], frontier)
    new_size = size + len(leaves)
    root = root_from(new_size, {**frontier, **created})
    signer = LogKey(default_log_key_path(url)).signer(origin)
    note = sign_note(Checkpoint(origin, new_size, root).text(), signer)
    now = time.time()
    with raw.transaction() as cur:
        for i, (job_id, leaf) in enumerate(leaves):
            cur.execute(
                raw.q(
                    "INSERT INTO tlog_leaves (idx, job_id, leaf, queued_at, integrated_at) "
                    "VALUES (?, ?, ?, ?, ?)"
                ),
                (size + i, job_id, leaf, now, now),
            )
        for (level, index), h in created.items():
            cur.execute(
                raw.q("INSERT INTO tlog_nodes (id, hash) VALUES (?, ?)"),
                (_node_id(level, index), h),
            )
        cur.execute(
            raw.q("INSERT INTO tlog_checkpoints (size, note, created_at) VALUES (?, ?, ?)"),
            (new_size, note, utc_now()),
        )
        cur.execute(raw.q("UPDATE tlog_state SET size = ?"), (new_size,))
    return new_size


def rebuild(url: str, job_ids: list[str], origin: str) -> None:
    """Rebuild the whole log by SQL with the jobs' seals in the order given (a history other
    than the one already published), signed by the real log key."""
    from affidavit.core.seal import log_leaf
    from affidavit.store import open_store
    from affidavit.tlog import Sequencer

    raw = RawDb(url)
    for table in ("tlog_queue", "tlog_leaves", "tlog_nodes", "tlog_checkpoints",
                  "tlog_cosignatures"):  # fmt: skip
        raw.execute(f"DELETE FROM {table}")
    raw.execute("UPDATE tlog_state SET size = 0, lease_owner = NULL, lease_until = NULL")
    store = open_store(url)
    try:
        for job in job_ids:
            seal = store.get_seal(job)
            assert seal is not None
            raw.execute(
                "INSERT INTO tlog_queue (job_id, leaf, queued_at) VALUES (?, ?, ?)",
                (job, log_leaf(seal), time.time()),
            )
        Sequencer(store, LogKey(default_log_key_path(url)), origin=origin).integrate()
    finally:
        store.close()
