"""A job's log and ledger are read in key order without sorting them, on both backends: the
plans the store's own statements get, measured without clocks.

A table's statistics know nothing of one long job among many short ones (nor of any job until
the table is analyzed), so PostgreSQL's planner, left alone, collects a long job's rows with a
bitmap scan and sorts them all — before the first row of a snapshot's stream, and again for
every page of a paged read, which then reads the rest of the log each time. The tables here
are never analyzed, as after a burst of writes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from affidavit.core.canonical import canonical
from affidavit.store import JobFilter, NewEvent, Store
from affidavit.store._seals import KEYS_SELECT
from affidavit.store._snapshot import LEDGER_COLUMNS_SELECT
from affidavit.store.postgres import PostgresSnapshot
from tests.conftest import PG_URL
from tests.store.plans import plan_nodes, rows_read, spied, sqlite_steps

LONG = 3_000  # events of the long job
PAGE = 100


def long_job(store: Store) -> str:
    """One job of LONG events and LONG // 2 ledger rows, among 50 jobs of one event."""
    with store.transaction(durable=False) as tx:
        for _ in range(50):
            job, _ = tx.create_job(status="completed")
            tx.append(job.job_id, [NewEvent("job_created", {})], expected_version=0)
        job, _ = tx.create_job(status="completed")
        events = [NewEvent("node_started", {"n": n}) for n in range(LONG)]
        tx.append(job.job_id, events, expected_version=0)
        for n in range(LONG // 2):
            tx.ledger_insert(
                job_id=job.job_id,
                key=f"key-{n:05d}",
                node_id="a",
                step_id="s",
                tool_name="t",
                args_hash="h",
                invocation_id=f"i{n}",
                attempt_id=None,
            )
    return job.job_id


def _explain_analyze(plans: list[dict[str, Any]]) -> Callable[[Any, str, Any], None]:
    """Take the PostgreSQL plan (``EXPLAIN ANALYZE``) of each statement on the store's own
    cursor, in its transaction, just before the statement runs."""

    def before(cur: Any, query: str, params: Any) -> None:
        cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params)
        [(doc,)] = cur.fetchall()
        plans.append((json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"])

    return before


def _page_steps(store: Store, job_id: str, after: int) -> int:
    def page() -> None:
        assert len(store.list_events(job_id, after_version=after, limit=PAGE)) == PAGE

    return sqlite_steps(store, page)


def test_a_page_of_a_long_log_reads_the_page_not_the_rest(store: Store) -> None:
    job_id = long_job(store)
    first, last = 0, LONG - PAGE
    for after in (first, last):  # the pages themselves, as the store returns them
        page = store.list_events(job_id, after_version=after, limit=PAGE)
        assert [e.version for e in page] == list(range(after + 1, after + PAGE + 1))
    if store.backend == "sqlite":
        costs = [_page_steps(store, job_id, after) for after in (first, last)]
        assert costs[0] <= 1.5 * costs[1] + 10, costs
        return
    plans: list[dict[str, Any]] = []
    with spied(store, "_log_reader", _explain_analyze(plans)):
        for after in (first, last):
            store.list_events(job_id, after_version=after, limit=PAGE)
    for plan in plans:
        assert not [n for n in plan_nodes(plan) if n["Node Type"] == "Sort"], plan
        # the page and the index entry after it, not the LONG - after rows after the page
        assert rows_read(plan) <= PAGE + 1, plan


@pytest.mark.parametrize("where", ["store", "transaction"])
def test_a_whole_log_is_read_in_key_order(store: Store, where: str) -> None:
    """``list_events(job)`` without a limit — a runner's read when it claims a job, ``jobs
    trace``, a pack's export — and a transaction's read of the log (a resumption's) walk the key
    rather than sort the whole log; in a transaction, the planner is back as it was after."""
    job_id = long_job(store)
    if store.backend == "sqlite":
        log_sql = store.log_sql  # type: ignore[attr-defined]
        with store.snapshot() as snap:
            for query, params in ((log_sql.after, (job_id, 0)), (log_sql.events, (job_id,))):
                plan = snap.query(f"EXPLAIN QUERY PLAN {query}", params)  # type: ignore[attr-defined]
                assert plan and not [row for row in plan if "TEMP B-TREE" in str(row)], plan
    plans: list[dict[str, Any]] = []
    if where == "store":
        explain = _explain_analyze(plans) if store.backend == "postgresql" else None
        with spied(store, "_log_reader", explain) if explain else contextlib.nullcontext():
            events = store.list_events(job_id)
    else:
        with store.transaction() as tx:
            if store.backend == "postgresql":
                real = tx.query

                def explained(sql: str, params: Any = ()) -> list[Any]:
                    if sql == tx.log_sql.events:
                        [(doc,)] = real(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
                        plans.append((json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"])
                    return real(sql, params)

                tx.query = explained  # type: ignore[method-assign]
            events = tx.list_events(job_id)
            if store.backend == "postgresql":
                assert real("SHOW enable_sort") == [("on",)]
    assert [e.version for e in events] == list(range(1, LONG + 1))
    assert events[7].payload == {"n": 7}
    if store.backend == "postgresql":
        assert len(plans) == 1
        assert not [n for n in plan_nodes(plans[0]) if n["Node Type"] == "Sort"], plans[0]
        assert rows_read(plans[0]) <= LONG + 1, plans[0]


def test_a_read_in_key_order_takes_no_round_trip_of_its_own(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the setting travels with the read, in one query (counted at the driver)."""
    if store.backend != "postgresql":
        pytest.skip("SQLite has no round trips (and needs no setting: see the test above)")
    job_id = long_job(store)
    sent: list[str] = []
    real = psycopg.ClientCursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.ClientCursor, "execute", counted)
    assert len(store.list_events(job_id, after_version=10, limit=5)) == 5
    assert len(store.list_events(job_id)) == LONG
    assert len(sent) == 2 and all(q.startswith("SET LOCAL enable_sort = off; ") for q in sent)


def test_pooled_connections_never_compile_statements(store: Store) -> None:
    """PostgreSQL: JIT compilation is off on the store's connections — a short statement whose
    estimated cost passes ``jit_above_cost`` was compiled with LLVM (~20 ms). Shown with the
    threshold at 0, on a plain connection first (where the server compiles) and then on the
    store's."""
    if store.backend != "postgresql":
        pytest.skip("PostgreSQL only: SQLite compiles nothing")
    query = "EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM generate_series(1, 1000)"

    def compiled(conn: Any) -> bool:
        with conn.transaction():
            conn.execute("SET LOCAL jit_above_cost = 0")
            [(doc,)] = conn.execute(query).fetchall()
        return "JIT" in (json.loads(doc) if isinstance(doc, str) else doc)[0]

    with psycopg.connect(PG_URL, autocommit=True) as plain:
        if not compiled(plain):
            pytest.skip("this PostgreSQL server has no JIT support (jit_provider not loaded)")
    with store._connection() as conn:  # type: ignore[attr-defined]
        assert not compiled(conn)


@pytest.mark.parametrize("what", ["log", "ledger"])
def test_a_snapshot_streams_a_long_log_in_key_order_without_sorting(
    store: Store, what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plans of the snapshot's streams, taken on its connection just before each runs; a
    listing of jobs in the same snapshot is planned as before (PostgreSQL: ``enable_sort`` is
    back on for it)."""
    job_id = long_job(store)
    plans: list[dict[str, Any]] = []
    if store.backend == "postgresql":
        real = PostgresSnapshot._stream

        def explained(self: Any, sql: str, params: Any, batch: int) -> Iterator[Any]:
            query = f"EXPLAIN (FORMAT JSON) {sql.replace('?', '%s')}"
            [(doc,)] = self._conn.execute(query, params).fetchall()
            plans.append((json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"])
            yield from real(self, sql, params, batch)

        monkeypatch.setattr(PostgresSnapshot, "_stream", explained)
    with store.snapshot() as snap:
        if store.backend == "sqlite":
            query = snap.log_sql.rows if what == "log" else LEDGER_COLUMNS_SELECT  # type: ignore[attr-defined]
            plan = snap.query(f"EXPLAIN QUERY PLAN {query}", (job_id,))  # type: ignore[attr-defined]
            assert plan and not [row for row in plan if "TEMP B-TREE" in str(row)], plan

        def read() -> list[Any]:
            return list(
                snap.iter_event_rows(job_id) if what == "log" else snap.iter_ledger_columns(job_id)
            )

        rows = read()
        # a listing of jobs is planned as before; a log read after it in key order again
        listed = snap.list_job_ids(JobFilter(status=["completed", "failed"], limit=5))
        assert len(listed) == 5
        if store.backend == "postgresql":
            assert snap.query("SHOW enable_sort") == [("on",)]  # type: ignore[attr-defined]
        assert read() == rows
        if store.backend == "postgresql":
            assert len(plans) == 2
            for tree in plans:
                assert not [n for n in plan_nodes(tree) if n["Node Type"] == "Sort"], tree
    if what == "log":
        assert [r[0] for r in rows] == list(range(1, LONG + 1))
        assert rows[5][3] == canonical({"n": 5})
    else:
        assert [r[0] for r in rows] == [f"key-{n:05d}" for n in range(LONG // 2)]


def test_a_statement_that_must_sort_is_not_compiled_in_a_snapshot(store: Store) -> None:
    """With sorting disabled, a statement that must sort anyway (the signing keys, which every
    verification reads) carries the planner's penalty in its cost, which passed PostgreSQL's
    ``jit_above_cost``: each was compiled with LLVM (~20 ms; ``verify --all`` of 1,000 small
    jobs took 28 s instead of 1.2). The snapshot's statements are not compiled."""
    job_id = long_job(store)
    with store.snapshot() as snap:
        assert len(list(snap.iter_event_rows(job_id))) == LONG
        if store.backend == "postgresql":
            query = f"EXPLAIN (ANALYZE, FORMAT JSON) {KEYS_SELECT}"
            [(doc,)] = snap.query(query)  # type: ignore[attr-defined]
            explained = (json.loads(doc) if isinstance(doc, str) else doc)[0]
            assert "JIT" not in explained, explained
        assert snap.keys_list() == []
