"""Round trips of the PostgreSQL store's write transactions (each a message of statements
sent with psycopg's client-side binding; each one before the commit's is one more round trip),
the server-side checks that let an append by a writer that knows the head go with its
commit (``affidavit_append_guard``, migration 9), and the hot statements prepared once per
connection (a ``PREPARE`` is a round trip of its own, the first time a connection sends that
statement; the counts below are of the other messages)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from affidavit import Runtime, Tool, ToolRegistry
from affidavit.core.canonical import canonical
from affidavit.core.errors import (
    ConflictError,
    FencedError,
    JobNotFound,
    LedgerRowExists,
    StoreError,
)
from affidavit.core.ids import new_attempt_id, new_event_ids
from affidavit.record._sealing import SigningKey
from affidavit.store import NewEvent, NextClaim, Store, open_store
from affidavit.store._pg_statements import _CLAIMED_LOG, _statement_name
from tests.conftest import PG_URL, with_schema


@pytest.fixture
def pg_store(pg_schema: str) -> Iterator[Store]:
    store = open_store(with_schema(PG_URL, pg_schema))
    yield store
    store.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every message the transactions send, each one round trip (they are still sent)."""
    messages: list[str] = []
    real = psycopg.ClientCursor.execute

    def execute(self: psycopg.ClientCursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        messages.append(str(query))
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.ClientCursor, "execute", execute)
    return messages


class _Syncs(list[int]):
    """``[n]``: the messages sent so far, those that prepare a statement left out."""

    def __init__(self, sent: list[str]) -> None:
        super().__init__([0])
        self._sent = sent

    def __getitem__(self, index: Any) -> Any:
        return sum(not m.startswith("PREPARE ") for m in self._sent)


@pytest.fixture
def syncs(sent: list[str]) -> list[int]:
    return _Syncs(sent)


def _prepares(sent: list[str]) -> list[str]:
    return [m for m in sent if m.startswith("PREPARE ")]


def _encoded(n: int) -> list[tuple[str, str, bytes]]:
    return [(i, "node_started", canonical({"n": k})) for k, i in enumerate(new_event_ids(n))]


def _leased_job(store: Store) -> tuple[str, str, bytes]:
    """A job with one event, leased to an attempt: (job id, attempt id, head)."""
    job, _ = store.create_job(events=[NewEvent("job_created", {})])
    attempt = new_attempt_id()
    with store.transaction() as tx:
        tx.set_lease(job.job_id, attempt_id=attempt, owner="w", expires_at=1.0)
    return job.job_id, attempt, bytes.fromhex(store.list_events(job.job_id)[-1].chain_hash)


def _insert_key(
    tx: Any,
    job_id: str,
    attempt: str,
    presumed_new: bool = False,
    *,
    key: str = "k",
    node_id: str = "n",
) -> bool:
    """T1's ledger insert of ``key`` (``k``); whether it won."""
    return bool(
        tx.ledger_insert(
            presumed_new=presumed_new,
            job_id=job_id,
            key=key,
            node_id=node_id,
            step_id="s",
            tool_name="t",
            args_hash="a",
            invocation_id="i",
            attempt_id=attempt,
        )
    )


def _counted(store: Store, syncs: list[int], body: Callable[[Any], Any]) -> tuple[int, Any]:
    before = syncs[0]
    with store.transaction() as tx:
        out = body(tx)
    return syncs[0] - before - 1, out  # (the commit's is the last)


def test_a_tool_step_takes_three_round_trips(pg_store: Store, syncs: list[int]) -> None:
    """T1 — the ledger insert only one attempt can win, then the started events — is two:
    the insert with the job's lock and head read, then the events with the commit. T2 — the
    closing events and the ledger row — is one: the server checks the append with the commit
    (an append that knows its head, as a run's does, needs no read before it)."""
    job_id, attempt, head = _leased_job(pg_store)

    def t1(tx: Any) -> list[Any]:
        assert _insert_key(tx, job_id, attempt) is True
        return list(
            tx.append(job_id, encoded=_encoded(2), expected_version=1, head=head, fence=attempt)
        )

    before_commit, stored = _counted(pg_store, syncs, t1)
    assert (before_commit, [e.version for e in stored]) == (1, [2, 3])
    head = bytes.fromhex(stored[-1].chain_hash)

    def t2(tx: Any) -> list[Any]:
        closing = tx.append(
            job_id, encoded=_encoded(3), expected_version=3, head=head, fence=attempt
        )
        tx.ledger_finish(job_id, "k", status="committed", result={"ok": True})
        return list(closing)

    before_commit, stored = _counted(pg_store, syncs, t2)
    assert (before_commit, [e.version for e in stored]) == (0, [4, 5, 6])
    assert pg_store.get_job(job_id).version == 6
    with pg_store.transaction() as tx:
        row = tx.ledger_get(job_id, "k")
    assert row is not None and (row.status, row.result) == ("committed", {"ok": True})


def test_a_step_the_log_never_started_takes_two_round_trips(
    pg_store: Store, syncs: list[int]
) -> None:
    """With the insert presumed new (the runner knows of no row for the key), T1's insert, the
    server-checked append and the commit travel together: one round trip, as T2's."""
    job_id, attempt, head = _leased_job(pg_store)

    def t1(tx: Any) -> list[Any]:
        assert _insert_key(tx, job_id, attempt, presumed_new=True) is True
        return list(
            tx.append(job_id, encoded=_encoded(2), expected_version=1, head=head, fence=attempt)
        )

    before_commit, stored = _counted(pg_store, syncs, t1)
    assert (before_commit, [e.version for e in stored]) == (0, [2, 3])
    with pg_store.transaction() as tx:
        row = tx.ledger_get(job_id, "k")
    assert row is not None and row.status == "started"


def test_a_presumed_new_insert_that_meets_its_row_writes_nothing(pg_store: Store) -> None:
    """If the key's row was there after all, the whole transaction fails with
    LedgerRowExists — the append sent with it undone — and the row is left as it was."""
    job_id, attempt, head = _leased_job(pg_store)
    with pg_store.transaction() as tx:
        assert _insert_key(tx, job_id, attempt) is True
    with pytest.raises(LedgerRowExists), pg_store.transaction() as tx:
        _insert_key(tx, job_id, attempt, presumed_new=True)
        tx.append(job_id, encoded=_encoded(2), expected_version=1, head=head, fence=attempt)
    assert pg_store.get_job(job_id).version == 1
    with pg_store.transaction() as tx:  # the connection was replaced; the store goes on
        assert _insert_key(tx, job_id, attempt) is False


def test_the_servers_refusals_are_the_clients_errors(pg_store: Store) -> None:
    """Each refusal of the server-side check is the error the client-side check raises, with
    what it carries, and the whole transaction is undone — the ledger row written with the
    refused append too."""
    job_id, attempt, head = _leased_job(pg_store)

    def refused(**kw: Any) -> None:
        with pg_store.transaction() as tx:
            tx.append(job_id, encoded=_encoded(1), **kw)
            # a ledger insert after it: the refusal surfaces at its read, before the commit
            _insert_key(tx, job_id, attempt)

    with pytest.raises(FencedError) as fenced:
        refused(expected_version=1, head=head, fence="another")
    assert (fenced.value.fence, fenced.value.current) == ("another", attempt)
    with pytest.raises(ConflictError) as ahead:
        refused(expected_version=2, head=head, fence=attempt)
    assert (ahead.value.expected, ahead.value.actual) == (2, 1)
    with pytest.raises(ConflictError, match="not the one this writer holds") as other_head:
        refused(expected_version=1, head=bytes(32), fence=attempt)
    assert (other_head.value.expected, other_head.value.actual) == (1, 1)
    with pytest.raises(JobNotFound), pg_store.transaction() as tx:
        tx.append("nope", encoded=_encoded(1), expected_version=0, head=b"")
    with pg_store.transaction() as tx:  # the lease handed back: no attempt holds it
        tx.set_lease(job_id, attempt_id=None, owner=None, expires_at=None)
    with pytest.raises(FencedError) as released, pg_store.transaction() as tx:
        tx.append(job_id, encoded=_encoded(1), expected_version=1, head=head, fence=attempt)
    assert released.value.current is None
    assert pg_store.get_job(job_id).version == 1
    with pg_store.transaction() as tx:
        assert tx.ledger_get(job_id, "k") is None


def test_a_status_change_reads_the_locked_job_in_one_round_trip(
    pg_store: Store, syncs: list[int]
) -> None:
    """``update_job`` (a job's completion, a cancel, a resume) locks and reads the job in one
    round trip, then writes with the commit; its fence holds as before."""
    job_id, attempt, _ = _leased_job(pg_store)
    before_commit, job = _counted(
        pg_store, syncs, lambda tx: tx.update_job(job_id, status="running", fence=attempt)
    )
    assert (before_commit, job.status) == (1, "running")
    with pytest.raises(FencedError), pg_store.transaction() as tx:
        tx.update_job(job_id, status="completed", fence="another")
    assert pg_store.get_job(job_id).status == "running"


def test_a_claim_is_one_round_trip_with_its_commit(pg_store: Store, syncs: list[int]) -> None:
    """A worker's claim (``Store.claim``) locks, leases and reads back the job in one
    statement, sent with its commit: one round trip, also when there is nothing to claim."""
    job, _ = pg_store.create_job(events=[NewEvent("job_created", {})])
    before = syncs[0]
    claimed = pg_store.claim(owner="w", attempt_id="a1", now=1.0, lease_seconds=10)
    assert syncs[0] - before == 1 and claimed is not None and claimed.job_id == job.job_id
    assert pg_store.get_job(job.job_id).attempt_id == "a1"  # committed
    before = syncs[0]
    assert pg_store.claim(owner="w", attempt_id="a2", now=2.0, lease_seconds=10) is None
    assert syncs[0] - before == 1


def test_a_claim_reads_the_log_in_its_round_trip(pg_store: Store, syncs: list[int]) -> None:
    """With ``with_log`` (a worker's claim), the job's log comes back in the claim's message:
    still one round trip, and the run reads nothing before its first step. With nothing to
    claim the message still goes (once), and reads no job's log."""
    job, _ = pg_store.create_job(events=[NewEvent("job_created", {})])
    pg_store.append(job.job_id, [NewEvent("node_started", {})], expected_version=1)
    before = syncs[0]
    claimed = pg_store.claim(owner="w", attempt_id="a1", now=1.0, lease_seconds=10, with_log=True)
    assert syncs[0] - before == 1
    assert claimed is not None and claimed.log is not None
    assert [e.type for e in claimed.log] == ["job_created", "node_started"]
    before = syncs[0]
    assert (
        pg_store.claim(owner="w", attempt_id="a2", now=2.0, lease_seconds=10, with_log=True) is None
    )
    assert syncs[0] - before == 1


def test_nothing_is_sent_after_a_read_that_carried_the_commit(pg_store: Store) -> None:
    job_id, attempt, _ = _leased_job(pg_store)
    with (
        pytest.raises(RuntimeError, match="after the transaction's commit"),
        pg_store.transaction() as tx,
    ):
        tx.commit_with_next_read()  # (a claim's: its read is the last statement)
        tx.get_job(job_id)
        tx.set_status(job_id, status="completed", fence=attempt)
    assert pg_store.get_job(job_id).status == "pending"


def test_a_runs_last_transaction_is_one_round_trip(pg_store: Store, syncs: list[int]) -> None:
    """The job's end as a run writes it — the terminal event, the status, the seal with its
    key and its log leaf — goes in one message with the commit; the leaf is queued only for
    the seal that is stored."""
    job_id, attempt, head = _leased_job(pg_store)
    key = SigningKey.generate()

    def end(tx: Any) -> None:
        hashes = tx.append(
            job_id, encoded=_encoded(1), expected_version=1, fence=attempt, head=head, hashes=True
        )
        tx.set_status(job_id, status="completed", fence=attempt, output={"ok": True})
        seal = key.seal(job_id, 2, hashes[-1].hex())
        tx.key_register(key.public, created_at=seal.sealed_at)
        tx.seal_insert(seal, leaf=b"leaf", queued_at=1.0)

    before_commit, _ = _counted(pg_store, syncs, end)
    assert before_commit == 0
    job = pg_store.get_job(job_id)
    assert (job.status, job.version, job.output) == ("completed", 2, {"ok": True})
    assert pg_store.get_seal(job_id) is not None
    with pg_store.transaction() as tx:
        assert [q.leaf for q in tx.tlog_queue_batch(5)] == [b"leaf"]


def test_a_claim_sent_with_a_commit_costs_no_round_trip(pg_store: Store, syncs: list[int]) -> None:
    """A run's last transaction carries the worker's next claim (``claim_after_commit``): the
    claim and its log read go in the commit's message, after the commit — still one round
    trip — and take the next job in a transaction of their own."""
    job_id, attempt, head = _leased_job(pg_store)
    waiting, _ = pg_store.create_job(events=[NewEvent("job_created", {"n": 2})])
    request = NextClaim("w", "a-next", 5.0, 10, with_log=True)

    def end(tx: Any) -> None:
        tx.append(
            job_id, encoded=_encoded(1), expected_version=1, fence=attempt, head=head, hashes=True
        )
        tx.set_status(job_id, status="completed", fence=attempt)
        tx.claim_after_commit(request)

    before_commit, _ = _counted(pg_store, syncs, end)
    assert before_commit == 0
    assert pg_store.get_job(job_id).status == "completed"
    assert request.made and request.claimed is not None
    assert request.claimed.job_id == waiting.job_id
    assert request.claimed.log is not None
    assert list(request.claimed.log) == pg_store.list_events(waiting.job_id)
    assert pg_store.get_job(waiting.job_id).attempt_id == "a-next"


def test_a_transaction_the_server_refuses_claims_nothing(pg_store: Store) -> None:
    """The append's fence is checked on the server, in the message that carries the claim: a
    refused append skips the rest of the message, the claim included."""
    job_id, _, head = _leased_job(pg_store)
    waiting, _ = pg_store.create_job(events=[NewEvent("job_created", {})])
    request = NextClaim("w", "a-next", 5.0, 10, with_log=True)
    with pytest.raises(FencedError), pg_store.transaction() as tx:
        tx.append(
            job_id, encoded=_encoded(1), expected_version=1, fence="other", head=head, hashes=True
        )
        tx.claim_after_commit(request)
    assert request.sent and not request.made
    assert pg_store.get_job(waiting.job_id).attempt_id is None
    assert pg_store.get_job(job_id).version == 1


def test_a_claim_that_fails_after_the_commit_leaves_the_commit(
    one_connection: Store, pg_schema: str
) -> None:
    """A claim the server refuses (here a trigger that rejects its owner) after the commit
    succeeded: the commit stands, the claim is not made (the worker claims the usual way),
    and the connection is clean for what comes next."""
    store = one_connection
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            f'SET search_path TO "{pg_schema}";'
            "CREATE FUNCTION refuse_owner() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.lease_owner = 'refused' THEN RAISE EXCEPTION 'owner refused'; END IF; "
            "RETURN NEW; END $$;"
            "CREATE TRIGGER refuse_owner BEFORE UPDATE ON jobs "
            "FOR EACH ROW EXECUTE FUNCTION refuse_owner()"
        )
    job_id, attempt, head = _leased_job(store)
    waiting, _ = store.create_job(events=[NewEvent("job_created", {})])
    request = NextClaim("refused", "a-next", 5.0, 10, with_log=True)
    with store.transaction() as tx:
        tx.append(
            job_id, encoded=_encoded(1), expected_version=1, fence=attempt, head=head, hashes=True
        )
        tx.set_status(job_id, status="completed", fence=attempt)
        tx.claim_after_commit(request)
    assert request.sent and not request.made
    job = store.get_job(job_id)
    assert (job.status, job.version) == ("completed", 2)
    assert store.get_job(waiting.job_id).attempt_id is None
    claimed = store.claim(owner="w", attempt_id="a2", now=5.0, lease_seconds=10, with_log=True)
    assert claimed is not None and claimed.job_id == waiting.job_id


def test_a_claim_after_a_read_goes_as_text_and_still_rides_on_the_commit(
    one_connection: Store, sent: list[str]
) -> None:
    """A transaction that read before its commit (its BEGIN sent) carries a claim whose
    statements its connection has not prepared as text: a PREPARE inside the transaction
    could abort it. Still no round trip of its own."""
    store = one_connection
    job_id, attempt, _ = _leased_job(store)
    waiting, _ = store.create_job(events=[NewEvent("job_created", {})])
    request = NextClaim("w", "a-next", 5.0, 10, with_log=True)
    del sent[:]
    with store.transaction() as tx:
        tx.get_job(job_id, for_update=True)  # a read: the transaction has begun
        tx.set_status(job_id, status="completed", fence=attempt)
        tx.claim_after_commit(request)
    assert request.made and request.claimed is not None
    assert request.claimed.job_id == waiting.job_id and request.claimed.log is not None
    assert len(request.claimed.log) == 1
    claim_prepares = [m for m in _prepares(sent) if "affidavit.claimed" in m]
    assert claim_prepares == [] and len(sent) - len(_prepares(sent)) == 2
    assert "affidavit.claimed" in sent[-1] and "affidavit.committed" in sent[-1]


@pytest.mark.parametrize("step_concurrency", [1, 2])
def test_a_workers_claims_ride_on_its_jobs_ends(
    pg_schema: str, sent: list[str], step_concurrency: int
) -> None:
    """A worker running job after job sends each next claim with the transaction that ends
    the job before: one claim of its own (the first), the others in the job ends' messages,
    the last of them finding nothing (the worker is idle then). Also when a job's steps may
    run concurrently."""
    url = with_schema(PG_URL, pg_schema)
    tools = ToolRegistry([Tool("noop", lambda ctx: {"ok": True}, "tool")])
    with Runtime(url, tools=tools, step_concurrency=step_concurrency) as rt:
        jobs = [
            rt.submit({"name": "one", "nodes": [{"id": "a", "type": "tool", "tool": "noop"}]}, {})
            for _ in range(4)
        ]
        del sent[:]
        assert rt.worker.run(until_idle=True) == 4
        assert all(rt.get_job(job.job_id).status == "completed" for job in jobs)
    read_log = f"EXECUTE {_statement_name(_CLAIMED_LOG, 1)}"  # (every claim of a worker's)
    claims = [m for m in sent if read_log in m]
    carried = [m for m in claims if "affidavit.committed" in m]
    assert (len(claims), len(carried)) == (5, 4)


def _tool_step(store: Store, job_id: str, attempt: str, head: bytes, key: str) -> bytes:
    """One tool step as a run writes it (T1 presumed new, then T2); the new head."""
    version = store.get_job(job_id).version
    with store.transaction() as tx:
        assert _insert_key(tx, job_id, attempt, presumed_new=True, key=key)
        head = tx.append(
            job_id,
            encoded=_encoded(2),
            expected_version=version,
            fence=attempt,
            head=head,
            hashes=True,
        )[-1]
    with store.transaction() as tx:
        head = tx.append(
            job_id,
            encoded=_encoded(3),
            expected_version=version + 2,
            fence=attempt,
            head=head,
            hashes=True,
        )[-1]
        tx.ledger_finish(job_id, key, status="committed", result={"key": key})
    return bytes(head)


@pytest.fixture
def one_connection(pg_schema: str) -> Iterator[Store]:
    store = open_store(with_schema(PG_URL, pg_schema) + "&pool_size=1")
    yield store
    store.close()


def test_a_connection_prepares_a_tool_steps_statements_once(
    one_connection: Store, sent: list[str]
) -> None:
    """The statements of T1 and T2 are prepared by the first step a connection writes and
    only executed by name after that: later steps send no PREPARE, and their messages hold
    EXECUTEs, not the statements' text."""
    store = one_connection
    job_id, attempt, head = _leased_job(store)
    del sent[:]
    head = _tool_step(store, job_id, attempt, head, "k0")
    first = _prepares(sent)
    # ledger insert, 2-row and 3-row events, finish (the guard: by the job's creation)
    assert len(first) == 4, first
    del sent[:]
    for n in range(1, 4):
        head = _tool_step(store, job_id, attempt, head, f"k{n}")
    assert _prepares(sent) == []
    writes = [m for m in sent if m.startswith("BEGIN")]
    assert len(writes) == 6 and all("INSERT INTO" not in m for m in writes)
    assert all(m.count("EXECUTE affidavit_") in (3, 4) for m in writes)
    assert store.get_job(job_id).version == 1 + 4 * 5
    with store.transaction() as tx:
        row = tx.ledger_get(job_id, "k3")
    assert row is not None and (row.status, row.result) == ("committed", {"key": "k3"})


def test_prepared_statements_outlive_a_rolled_back_transaction(
    one_connection: Store, sent: list[str]
) -> None:
    """A refused transaction is rolled back on the connection that prepared the statements:
    they stay prepared (a rollback does not undo a PREPARE, and psycopg, which would drop
    every prepared statement after a rollback, prepares nothing on the store's
    connections), so the next step executes them without preparing them again."""
    store = one_connection
    job_id, attempt, head = _leased_job(store)
    head = _tool_step(store, job_id, attempt, head, "k0")
    with pytest.raises(FencedError), store.transaction() as tx:
        tx.append(
            job_id, encoded=_encoded(2), expected_version=6, fence="other", head=head, hashes=True
        )
        tx.ledger_finish(job_id, "k0", status="failed", error={"no": 1})
    with store.transaction() as tx:
        _insert_key(tx, job_id, attempt)
    with pytest.raises(LedgerRowExists), store.transaction() as tx:  # (a unique violation)
        _insert_key(tx, job_id, attempt, presumed_new=True)
        tx.ledger_finish(job_id, "k", status="failed", error={"no": 1})
    del sent[:]
    _tool_step(store, job_id, attempt, head, "k1")
    assert _prepares(sent) == [] and store.get_job(job_id).version == 11


def test_a_new_connection_prepares_again(one_connection: Store, sent: list[str]) -> None:
    """A session the server ended takes its prepared statements with it: the connection that
    replaces it prepares them anew, and the run goes on."""
    store = one_connection
    job_id, attempt, head = _leased_job(store)
    head = _tool_step(store, job_id, attempt, head, "k0")
    with store.transaction() as tx:  # (the pool's one connection)
        (pid,) = tx.query("SELECT pg_backend_pid()")[0]
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    with contextlib.suppress(StoreError):  # (the pool may find the broken one first)
        store.get_job(job_id)
    del sent[:]
    _tool_step(store, job_id, attempt, head, "k1")
    assert len(_prepares(sent)) >= 5 and store.get_job(job_id).version == 11


def test_values_read_back_the_same_through_prepared_and_plain_statements(
    pg_schema: str,
) -> None:
    """A ledger row written through a prepared statement (the values as EXECUTE's
    arguments) reads back as the one written with the statement's text (prepare=off)."""
    hostile = "it's \\ a 'quoted' \n value; DROP TABLE jobs; -- é \U0001f600"
    rows = []
    for prepare in ("on", "off"):
        store = open_store(with_schema(PG_URL, pg_schema) + f"&prepare={prepare}")
        try:
            job_id, attempt, head = _leased_job(store)
            with store.transaction() as tx:
                _insert_key(tx, job_id, attempt, True, key=hostile, node_id=hostile)
                tx.append(
                    job_id,
                    encoded=_encoded(7),
                    expected_version=1,
                    fence=attempt,
                    head=head,
                    hashes=True,
                )
                tx.ledger_finish(
                    job_id, hostile, status="committed", result={"v": hostile, "n": -1.5}
                )
            with store.transaction() as tx:
                row = tx.ledger_get(job_id, hostile)
            assert row is not None
            rows.append((row.node_id, row.status, row.result, store.get_job(job_id).version))
        finally:
            store.close()
    assert rows[0] == rows[1] == (hostile, "committed", {"v": hostile, "n": -1.5}, 8)


def test_prepare_off_sends_every_statement_as_text(pg_schema: str, sent: list[str]) -> None:
    """Behind a connection pooler in transaction mode (``prepare=off``) nothing is prepared."""
    store = open_store(with_schema(PG_URL, pg_schema) + "&prepare=off")
    try:
        job_id, attempt, head = _leased_job(store)
        _tool_step(store, job_id, attempt, head, "k0")
    finally:
        store.close()
    assert _prepares(sent) == [] and not any("EXECUTE" in m for m in sent)


def test_claims_on_one_connection_each_read_their_own_jobs_log(one_connection: Store) -> None:
    """The claim's log read is prepared once and run for job after job on one connection
    (past the executions after which the server keeps a generic plan): each claim returns its
    own job's log, whole."""
    store = one_connection
    jobs = []
    for n in range(8):
        job, _ = store.create_job(events=[NewEvent("job_created", {"n": n})])
        store.append(job.job_id, [NewEvent("node_started", {})] * (n % 3), expected_version=1)
        jobs.append(job.job_id)
    for n, job_id in enumerate(jobs):
        claimed = store.claim(
            owner="w", attempt_id=f"a{n}", now=1.0, lease_seconds=10, with_log=True
        )
        assert claimed is not None and claimed.job_id == job_id and claimed.log is not None
        assert list(claimed.log) == store.list_events(job_id)
        assert len(claimed.log) == 1 + n % 3 and claimed.log[0].payload == {"n": n}
